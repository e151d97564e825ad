"""The checkpoint interval and the expected time lost to failures (planner.estimate.resilience): Daly's closed form
against the numerical optimum of his model, the lost fraction against a simulation of Poisson failures."""
import math
import random

import pytest
from scipy.optimize import minimize_scalar

from partita.costmodel.errors import PartitaError
from partita.planner.estimate import resilience as r

HOUR = r.HOUR


@pytest.mark.parametrize("save_s,mtbf_h", [(10, 3.09), (60, 3.09), (300, 24), (5, 0.5), (600, 1)])
def test_dalys_interval_is_the_optimum_of_his_model(save_s, mtbf_h):
    m, restart = mtbf_h * HOUR, 120.0
    best = minimize_scalar(lambda t: r.wall_per_work(t, save_s, restart, m), bounds=(1.0, 10 * m), method="bounded",
                           options={"xatol": 1e-3})
    t = r.daly_interval(save_s, m)
    assert t == pytest.approx(best.x, rel=0.03)
    # and the wall time it gives is the optimum's within 0.05%
    assert r.wall_per_work(t, save_s, restart, m) <= best.fun * 1.0005
    # Young's first-order interval is the leading term: close when saves are short against M, shorter than optimal
    # by the higher-order terms otherwise
    assert r.young_interval(save_s, m) == pytest.approx(math.sqrt(2 * save_s * m))
    assert abs(r.young_interval(save_s, m) / t - 1) < 3 * math.sqrt(save_s / (2 * m)) + 0.01


def test_a_save_longer_than_twice_the_mtbf_checkpoints_once_per_mtbf():
    assert r.daly_interval(3 * HOUR, 1 * HOUR) == HOUR


def _simulated_lost_fraction(interval, save, restart, mtbf, segments, seed=0):
    """Train `segments` intervals of `interval` s, each followed by a save; failures arrive as a Poisson process of
    mean gap `mtbf` and strike anywhere (computing, saving, restarting); a failure loses the unsaved interval."""
    rng = random.Random(seed)
    wall, done = 0.0, 0
    next_fail = rng.expovariate(1 / mtbf)
    while done < segments:
        need = interval + save
        if wall + need <= next_fail:
            wall += need
            done += 1
            continue
        wall = next_fail  # lost: the interval since the last save
        while True:       # restart; a failure during the restart restarts it
            next_fail = wall + rng.expovariate(1 / mtbf)
            if wall + restart <= next_fail:
                wall += restart
                break
            wall = next_fail
    return 1 - segments * interval / wall


@pytest.mark.parametrize("interval,save,restart,mtbf", [(1800, 60, 300, 3 * HOUR), (600, 30, 120, HOUR)])
def test_the_lost_fraction_matches_a_simulation_of_poisson_failures(interval, save, restart, mtbf):
    predicted = r.lost_fraction(interval, save, restart, mtbf)
    simulated = _simulated_lost_fraction(interval, save, restart, mtbf, segments=100_000)
    assert simulated == pytest.approx(predicted, rel=0.03)


def test_a_plans_price_uses_its_checkpoint_bytes_and_states_what_it_assumed():
    p = r.price(parameters=8_000_000_000, dtype="bf16", optimizer="adam", master_weights="fp32", nodes=4,
                step_s=2.0, mtbf_s=10 * HOUR)
    # bf16 weights and an fp32 master, m and v: 14 bytes per parameter, written by 4 nodes at 2 GB/s each
    assert p.checkpoint_bytes == 8e9 * 14
    assert p.save_s == pytest.approx(8e9 * 14 / (4 * r.DEFAULT_STORAGE_BW))
    assert p.restart_s == pytest.approx(r.DEFAULT_RESTART_S + p.save_s)
    assert p.interval_s == pytest.approx(r.daly_interval(p.save_s, 10 * HOUR))
    assert abs(p.every_steps * 2.0 - p.interval_s) <= 1.0
    assert len(p.assumptions) == 2 and "assumed" in p.line() + " ".join(p.assumptions)
    stated = r.price(parameters=8_000_000_000, dtype="bf16", optimizer="adam", master_weights="none", nodes=4,
                     step_s=2.0, mtbf_s=10 * HOUR, storage_bw=10e9, restart_s=0)
    assert stated.checkpoint_bytes == 8e9 * 6 and stated.assumptions == ()  # pure bf16: weights, m and v in bf16
    assert stated.lost_fraction < p.lost_fraction  # faster storage and restarts lose less
    assert r.Resilience.from_dict(p.to_dict()) == p


@pytest.mark.parametrize("kwargs,needle", [({"step_s": 0}, "step s must be a positive"),
                                           ({"mtbf_s": -1}, "mtbf s must be a positive"),
                                           ({"storage_bw": 0.0}, "storage bw must be a positive"),
                                           ({"restart_s": -5}, "restart time must be at least 0")])
def test_bad_figures_are_one_line(kwargs, needle):
    args = dict(parameters=1000, dtype="fp32", optimizer="adam", master_weights="fp32", nodes=1, step_s=1.0,
                mtbf_s=HOUR)
    with pytest.raises(PartitaError, match=needle):
        r.price(**{**args, **kwargs})
