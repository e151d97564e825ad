"""benchmarks.memory_acceptance: the rows that state a peak or were refused on memory are the ones checked, a stated
peak is compared with what it reads (benchmarks.published.MEMORY_KINDS),
and the H200 measurements stay exact."""
from __future__ import annotations

import dataclasses

import pytest

from benchmarks.memory_acceptance import all_rows, check, refused_keys, select
from benchmarks.published import cluster_for, row_key
from partita.costmodel.hardware import GiB
from partita.costmodel.errors import PartitaError


def test_the_default_selection_is_the_stated_and_the_refused_rows():
    rows = all_rows()
    chosen = {row_key(r) for r in select(rows, None, False)}
    assert {row_key(r) for r in rows if r.memory_gib is not None} <= chosen
    assert refused_keys() & {row_key(r) for r in rows} <= chosen


def test_a_stated_peak_is_set_against_what_it_reads():
    """allocated: the allocated peak; reserved: with the allocator's cache; device (nvidia-smi's used memory): with
    the device's reserve for the CUDA context and NCCL as well; any other kind is refused in one line."""
    row = next(r for r in all_rows() if r.memory_gib is not None and r.memory_kind == "reserved")
    read = {kind: check(dataclasses.replace(row, memory_kind=kind), {}) for kind in ("allocated", "reserved", "device")}
    terms = read["reserved"]["terms_gib"]
    assert {k: v["stated"]["compared"] for k, v in read.items()} == {k: k for k in read}
    assert read["allocated"]["stated"]["predicted_gib"] == pytest.approx(terms["allocated"])
    assert read["reserved"]["stated"]["predicted_gib"] == pytest.approx(terms["reserved"])
    assert terms["reserved"] > terms["allocated"]
    context = cluster_for(row).device.reserved_bytes / GiB  # the device's reserve for the CUDA context and NCCL
    assert context > 0 and read["device"]["stated"]["predicted_gib"] == pytest.approx(terms["reserved"] + context)
    with pytest.raises(PartitaError, match="memory_kind 'smi' is not one of allocated, reserved, device"):
        check(dataclasses.replace(row, memory_kind="smi"), {})


def test_the_h200_measurements_stay_exact():
    row = next(r for r in all_rows() if row_key(r).endswith("H200-141GBx1/gb8/mb2"))
    out = check(row, {})
    assert not out["refused"] and out["stated"]["compared"] == "allocated"
    assert abs(out["stated"]["error"]) < 0.01
    t = out["terms_gib"]
    assert t["allocated"] == pytest.approx(sum(t[k] for k in ("parameters", "gradients", "optimizer_state",
                                                              "activations", "transients")))
