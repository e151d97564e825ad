"""benchmarks.memory_acceptance: the rows that state a peak or were refused on memory are the ones checked, a stated
peak is compared with what it reads (reserved: allocated + the allocator's predicted cache; allocated: alone),
and the H200 measurements stay exact."""
from __future__ import annotations

import pytest

from benchmarks.memory_acceptance import all_rows, check, reads_reserved, refused_keys, select
from benchmarks.published import row_key


def test_the_default_selection_is_the_stated_and_the_refused_rows():
    rows = all_rows()
    chosen = {row_key(r) for r in select(rows, None, False)}
    assert {row_key(r) for r in rows if r.memory_gib is not None} <= chosen
    assert refused_keys() & {row_key(r) for r in rows} <= chosen


def test_a_reading_is_reserved_or_allocated():
    readings = {r.memory_reading for r in all_rows() if r.memory_gib is not None}
    assert readings and all(reads_reserved(x) == ("reserved" in x) for x in readings)
    assert not reads_reserved("torch.cuda.max_memory_allocated (allocated tensors, not the allocator's cache)")


def test_the_h200_measurements_stay_exact():
    row = next(r for r in all_rows() if row_key(r).endswith("H200-141GBx1/gb8/mb2"))
    out = check(row, {})
    assert not out["refused"] and out["stated"]["compared"] == "allocated"
    assert abs(out["stated"]["error"]) < 0.01
    t = out["terms_gib"]
    assert t["allocated"] == pytest.approx(sum(t[k] for k in ("parameters", "gradients", "optimizer_state",
                                                              "activations", "transients")))
