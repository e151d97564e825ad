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


def test_snapshots_in_memory_are_priced_by_the_same_model_over_the_host_link_and_the_ring():
    kw = dict(written=10e9, shard=20e9, devices_per_node=8, host_bw=25e9, snapshot_bw=50e9, node_bw=400e9,
              step_s=5.0, mtbf_s=3 * HOUR, restart_s=60.0)
    ring, alone = r.price_snapshots(ring=True, **kw), r.price_snapshots(ring=False, **kw)
    # the rank's bytes over its host link, plus the node's 80 GB to the next node, beside a step of 5 s: no stall
    assert ring.copy_s == pytest.approx(10e9 / 25e9 + 80e9 / 400e9) and alone.copy_s == pytest.approx(0.4)
    assert ring.snapshot_s == 0 and ring.every_steps == 1
    # or at what the node's memory takes, when that is the slower; beyond the step's 5 s it stalls
    slow = r.price_snapshots(ring=True, **{**kw, "snapshot_bw": 1e9})
    assert slow.copy_s == pytest.approx(10.2) and slow.snapshot_s == pytest.approx(5.2)
    ring = slow
    # recovery: the restart, every rank's whole shard gathered over the node's links, and onto the device
    assert ring.recover_s == pytest.approx(60 + 160e9 / 400e9 + 20e9 / 25e9)
    assert ring.interval_s == pytest.approx(r.daly_interval(ring.snapshot_s, 3 * HOUR)) and ring.every_steps > 1
    assert ring.lost_fraction == pytest.approx(r.lost_fraction(ring.every_steps * 5.0, ring.snapshot_s,
                                                               ring.recover_s, 3 * HOUR))
    assert alone.lost_fraction < ring.lost_fraction
    disk = r.price(parameters=8_000_000_000, dtype="bf16", optimizer="adam", master_weights="fp32", nodes=4,
                   step_s=5.0, mtbf_s=3 * HOUR)
    assert ring.lost_fraction < disk.lost_fraction  # the same restart, a cheaper save and read-back


def test_a_plans_snapshot_is_its_share_of_the_state_and_recovery_its_whole_shard():
    from types import SimpleNamespace as NS
    from partita.costmodel.hardware import parse_cluster

    def plan(pp=1, dp=16, tp=1, zero=0):
        return NS(train={"dtype": "bf16", "optimizer": "adam", "master_weights": "fp32"}, zero_stage=zero,
                  mesh=NS(pp=pp, dp=dp, tp=tp, world_size=pp * dp * tp), model={"parameters": 1_000_000},
                  predicted={"step_time_s": 1.0})
    # bf16 weights (2 B), an fp32 master and m, v (12 B): a rank's shard, divided by what shards them
    assert r.rank_state_bytes(plan()) == pytest.approx(14e6)
    assert r.rank_state_bytes(plan(zero=1, dp=8)) == pytest.approx(2e6 + 12e6 / 8)
    assert r.rank_state_bytes(plan(zero=3, pp=2, tp=2, dp=2)) == pytest.approx(14e6 / 8)
    cluster = parse_cluster("2x8xH100-80GB")
    priced = r.price_plan(plan(), nodes=2, mtbf_s=HOUR, cluster=cluster)
    snaps = priced.snapshots
    assert snaps.rank_bytes == pytest.approx(14e6 / 16) and snaps.ring  # the state once, over 16 ranks
    assert snaps.copy_s == pytest.approx(14e6 / 16 / r.DEFAULT_SNAPSHOT_BW + 14e6 / 16 * 8 / (
        cluster.device.inter_node_bw * cluster.device.inter_link_efficiency * 8))
    assert snaps.snapshot_s == 0  # hidden behind the next step's second
    assert not r.price_plan(plan(dp=8), nodes=1, mtbf_s=HOUR, cluster=parse_cluster("1x8xH100-80GB")).snapshots.ring
    assert "with snapshots in memory every" in priced.line() and any("--snapshot-bandwidth" in a
                                                                    for a in priced.assumptions)
    assert r.Resilience.from_dict(priced.to_dict()) == priced
    stated = r.price_plan(plan(), nodes=2, mtbf_s=HOUR, cluster=cluster, snapshot_bw=1e9)
    assert stated.snapshots.copy_s > snaps.copy_s  # 1 GB/s: slower than the assumed 5
    assert not any("--snapshot-bandwidth" in a for a in stated.assumptions)
