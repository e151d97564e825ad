"""The run report's memory lines: peak reserved (torch.cuda.max_memory_reserved) is shown and written where the
run measured it (CUDA), and left out elsewhere."""
import dataclasses

from partita.runtime.loop.memory import CPU_METHOD, GPU_METHOD
from partita.runtime.loop.report import RunResult, render

MiB = 2**20


def _result(**kw) -> RunResult:
    return RunResult(losses=[2.0, 1.9], step_times=[0.3, 0.1], peak_memory_bytes=3 * MiB, memory_method=GPU_METHOD,
                     peak_rss_bytes=900 * MiB, tokens_per_step=64, **kw)


def test_peak_reserved_is_reported_where_it_was_measured():
    r = _result(peak_reserved_bytes=5 * MiB)
    lines = render(r, "header", {"step_time_s": 0.1, "peak_memory_bytes": 3 * MiB}).splitlines()
    reserved = [line for line in lines if line.startswith("peak reserved")]
    assert len(reserved) == 1 and "5.00 MiB" in reserved[0] and "max_memory_reserved" in reserved[0]
    assert r.to_json()["peak_reserved_bytes"] == 5 * MiB
    cpu = dataclasses.replace(r, peak_reserved_bytes=None, memory_method=CPU_METHOD)
    assert not any(line.startswith("peak reserved") for line in render(cpu, "header", {}).splitlines())
    assert cpu.to_json()["peak_reserved_bytes"] is None
