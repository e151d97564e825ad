import functools
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture


@functools.lru_cache(maxsize=None)
def captured(name: str, dtype: str = "fp32"):
    return capture(resolve_model(name), dtype=dtype)


@pytest.fixture
def graph_of():
    return captured


E2E = str(Path(__file__).resolve().parent / "e2e")


LONGEST_FIRST = ("tests/notebooks/", "tests/e2e/", "tests/examples/", "tests/benchmarks/test_islands.py",
                 "tests/benchmarks/test_rec_bench.py", "tests/runtime/", "tests/test_packaging.py",
                 "tests/planner/test_untrusted_plans.py", "tests/costmodel/test_fusion.py",
                 "tests/costmodel/test_hf_families.py", "tests/costmodel/test_calibrate.py",
                 "tests/planner/test_same_plan_under_load.py",
                 "tests/planner/test_bounds.py", "tests/planner/test_baselines_determinism.py")
"""Folders and files whose tests take longest (scripts/test.sh --durations=40): under pytest-xdist (scripts/test.sh
runs three workers, stealing work) they are queued first, so that no long test starts last while the others idle. The
multi-rank runtime tests were last (tests/runtime/ sorts after the rest), with the wheel build after them. Added from
the durations of session 70 (2026-12-01): the islands benchmark's test (77 s), the untrusted-plans fuzz (41 s) and the
compiled-block test (31 s)."""


SESSION_CACHE_ENV = "PARTITA_TEST_CACHE_DIR"
"""The session's capture cache (costmodel.capture.cache), made by the first pytest process: pytest-xdist's workers,
started after it, and every process a test launches inherit it."""


def pytest_configure(config):
    """One capture cache for the whole session, in a temporary folder -- never the user's ~/.cache: the tests
    plan the same small models many times, in this process and in launched ones, and each captures once. A test
    that needs a cold capture points PARTITA_CACHE_DIR at its own folder (or at "off")."""
    if SESSION_CACHE_ENV not in os.environ:  # the first process: the controller, or a run without workers
        os.environ[SESSION_CACHE_ENV] = tempfile.mkdtemp(prefix="partita-test-cache-")
        config._partita_cache_made = os.environ[SESSION_CACHE_ENV]
    os.environ["PARTITA_CACHE_DIR"] = os.environ[SESSION_CACHE_ENV]


def pytest_unconfigure(config):
    made = getattr(config, "_partita_cache_made", None)
    if made:
        shutil.rmtree(made, ignore_errors=True)
        os.environ.pop(SESSION_CACHE_ENV, None)


def pytest_collection_modifyitems(session, config, items):
    def rank(item) -> int:
        path = item.nodeid
        return next((i for i, prefix in enumerate(LONGEST_FIRST) if path.startswith(prefix)), len(LONGEST_FIRST))
    items.sort(key=rank)  # stable: each file's tests keep their order


def pytest_sessionfinish(session, exitstatus):
    """The long-lived ranks of tests/rank_pool.py end with the session."""
    import rank_pool
    rank_pool.close_shared()


@pytest.fixture
def two_tower(monkeypatch):
    """MODEL string of a user's factory model that is not one stack of identical layers (two towers of
    blocks, a tied head; tests/e2e/two_tower.py): the planner's general block program, pipelines allowed."""
    monkeypatch.syspath_prepend(E2E)
    return "two_tower:factory"


def measured_saved_bytes(model, run) -> int:
    """Bytes autograd saves for backward while `run()` executes a real forward (each storage once;
    parameters and buffers excluded) -- the quantity the cost model predicts as saved_bytes."""
    import torch

    state = {p.untyped_storage().data_ptr() for p in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}

    def pack(t):
        key = t.untyped_storage().data_ptr()
        if key not in state:
            seen[key] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())
