"""The run report's memory lines: peak reserved (torch.cuda.max_memory_reserved) is shown and written where the
run measured it (CUDA), and left out elsewhere."""
import dataclasses

from partita.runtime.loop.memory import CPU_METHOD, GPU_METHOD
from partita.runtime.loop.report import RunResult, render

MiB = 2**20


def _result(**kw) -> RunResult:
    kw = {"losses": [2.0, 1.9], "step_times": [0.3, 0.1], **kw}
    return RunResult(peak_memory_bytes=3 * MiB, memory_method=GPU_METHOD, peak_rss_bytes=900 * MiB, tokens_per_step=64,
                     **kw)


def test_peak_reserved_is_reported_where_it_was_measured():
    r = _result(peak_reserved_bytes=5 * MiB)
    lines = render(r, "header", {"step_time_s": 0.1, "peak_memory_bytes": 3 * MiB}).splitlines()
    reserved = [line for line in lines if line.startswith("peak reserved")]
    assert len(reserved) == 1 and "5.00 MiB" in reserved[0] and "max_memory_reserved" in reserved[0]
    assert r.to_json()["peak_reserved_bytes"] == 5 * MiB
    cpu = dataclasses.replace(r, peak_reserved_bytes=None, memory_method=CPU_METHOD)
    assert not any(line.startswith("peak reserved") for line in render(cpu, "header", {}).splitlines())
    assert cpu.to_json()["peak_reserved_bytes"] is None


def test_a_long_run_shows_the_first_and_last_steps_and_the_worst_verified_one():
    """100k steps printed 100k loss lines (#46): the table keeps the first and last SHOWN_STEPS steps, says how
    many it leaves out, and under --verify also the step furthest from the reference; a short run is whole."""
    from partita.runtime.loop.report import SHOWN_STEPS
    n = 1000
    losses = [1.0 + i * 1e-3 for i in range(n)]
    ref = list(losses)
    ref[500] += 1e-3  # the step a reader of --verify's table must see
    r = _result(losses=losses, step_times=[0.1] * n, reference_losses=ref, max_abs_diff=1e-3, tolerance=1e-5)
    lines = render(r, None, {}).splitlines()
    rows = [line for line in lines if line[:5].strip().isdigit()]
    steps = [int(line.split()[0]) for line in rows]
    assert steps == [*range(1, SHOWN_STEPS + 1), 501, *range(n - SHOWN_STEPS + 1, n + 1)]
    gaps = [line for line in lines if "not shown" in line]
    assert gaps == [f" ...  {500 - SHOWN_STEPS} step(s) not shown (--losses-out keeps every step's loss)",
                    f" ...  {n - SHOWN_STEPS - 501} step(s) not shown (--losses-out keeps every step's loss)"]
    short = render(_result(losses=losses[:2 * SHOWN_STEPS + 1], step_times=[0.1] * 21), None, {}).splitlines()
    assert sum(line[:5].strip().isdigit() for line in short) == 2 * SHOWN_STEPS + 1
    assert not any("not shown" in line for line in short)
