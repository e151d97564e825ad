"""Inputs from the data: pooling factors, ID distributions and LRU miss-ratio curves (issue 28, item 2)."""
from collections import OrderedDict

import numpy as np
import pytest

from partita.costmodel.sparse.embeddings import Table, load_sample, lru_stack_distances, sample_access, zipf_access
from partita.costmodel.errors import PartitaError
from partita.cli import main


def lru_misses(ids, capacity: int) -> float:
    """A plain LRU cache, simulated access by access."""
    cache, misses = OrderedDict(), 0
    for x in ids.tolist():
        if x in cache:
            cache.move_to_end(x)
        else:
            misses += 1
            cache[x] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return misses / len(ids)


def test_stack_distances_are_lru_exactly():
    rng = np.random.default_rng(0)
    ids = rng.zipf(1.3, size=4000) % 300
    acc = sample_access(ids, None, "test")
    for c in (1, 7, 40, 150, 299):
        assert acc.miss_ratio(c) == pytest.approx(lru_misses(ids, c), abs=1e-12)
    assert list(lru_stack_distances(np.array([5, 6, 5, 7, 6, 5]))) == [np.inf, np.inf, 2, np.inf, 3, 3]


def test_che_approximation_matches_simulated_zipf():
    rows, alpha = 2000, 1.1
    rng = np.random.default_rng(1)
    p = np.arange(1, rows + 1, dtype=float) ** -alpha
    ids = rng.choice(rows, size=60_000, p=p / p.sum())
    model = zipf_access(rows, alpha, 1)
    for c in (20, 200, 1000):
        assert model.miss_ratio(c) == pytest.approx(lru_misses(ids[10_000:], c), abs=0.02)
    distinct = np.mean([len(np.unique(rng.choice(rows, size=500, p=p / p.sum()))) for _ in range(20)])
    assert model.distinct(500) == pytest.approx(distinct, rel=0.05)


def test_skew_lowers_the_miss_ratio_and_uniform_is_linear():
    uniform = zipf_access(10**6, 0.0, 1)
    assert uniform.miss_ratio(2 * 10**5) == pytest.approx(0.8, abs=0.01)
    assert zipf_access(10**6, 1.2, 1).miss_ratio(2 * 10**5) < 0.1


def _write(tmp_path, arrays):
    path = tmp_path / "sample.npz"
    np.savez(path, **arrays)
    return str(path)


def test_sample_gives_pooling_and_curve(tmp_path):
    tables = [Table(name="users", rows=100, dim=8), Table(name="items", rows=50, dim=8)]
    path = _write(tmp_path, {"users": np.array([1, 2, 1, 3, 1, 2]), "users.lengths": np.array([2, 1, 3]),
                             "items": np.array([4, 4, 4])})
    acc = load_sample(path, tables)
    assert acc["users"].pooling == 2.0 and acc["items"].pooling == 1.0
    assert acc["items"].miss_ratio(1) == pytest.approx(1 / 3)


@pytest.mark.parametrize("arrays, words", [
    ({"users": np.array([1])}, "missing items"),
    ({"users": np.array([1]), "items": np.array([1]), "clicks": np.array([1])}, "not in the model clicks"),
    ({"users": np.array([100]), "items": np.array([1])}, "outside its table's 100 rows"),
    ({"users": np.array([1, 2]), "users.lengths": np.array([1]), "items": np.array([1])}, "sum to the 2 IDs"),
])
def test_a_sample_that_does_not_match_is_one_line(tmp_path, arrays, words):
    tables = [Table(name="users", rows=100, dim=8), Table(name="items", rows=50, dim=8)]
    with pytest.raises(PartitaError, match=words) as e:
        load_sample(_write(tmp_path, arrays), tables)
    assert "\n" not in str(e.value)


def test_cli_bad_sample_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(__import__("pathlib").Path(__file__).resolve().parents[1]))
    path = _write(tmp_path, {"users": np.array([1, 2])})
    code = main(["plan", "--model", "rec_factories:two_tables", "--cluster", "2xcpu", "--global-batch", "8",
                 "--data", path])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "missing items" in err
