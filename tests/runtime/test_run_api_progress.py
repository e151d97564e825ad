"""Issue 30 items 2 and 4 through the Python API, in one process (a one-rank gloo group, no torchrun):

- `partita.run(..., verify=True)` raises VerifyFailed (a PartitaError naming what diverged) when the run
  differs from one process, as `partita run --verify` exits 1; it used to return normally;
- progress lines while training, from the formatter `partita run` uses too (runtime.loop.progress): rank 0
  prints one after the first step, every N steps and after the last;
- `tensorboard=DIR` writes each step's loss, step time, throughput and memory; without the tensorboard
  package it is one line before training.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import partita
import partita.runtime as runtime
from partita.costmodel import PartitaError

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
from test_plans_match_single_process import make_plan  # noqa: E402

DROPOUT = "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=32,dropout=0.1"
LINE = re.compile(r"^step +(\d+)/(\d+)  loss (\d+\.\d{5})  \d+\.\d{4} s/step  [\d,]+ tokens/s  mem [\d.]+ (MiB|GiB)  "
                  r"eta \d+(s|m\d\ds|h\d\dm)$")


def test_run_with_verify_raises_when_the_run_differs_from_one_process():
    """Dropout draws its masks in another order than the reference's (the note says so): verify fails."""
    with pytest.raises(runtime.VerifyFailed) as failed:
        runtime.run(make_plan(DROPOUT, micro=2), DROPOUT, steps=2, verify=True, print_report=False)
    assert isinstance(failed.value, PartitaError) and partita.VerifyFailed is runtime.VerifyFailed
    assert str(failed.value).startswith("verify FAILED: losses, step ")
    assert failed.value.result.verified is False and len(failed.value.result.losses) == 2
    ok = runtime.run(make_plan("tiny-gpt"), "tiny-gpt", steps=2, verify=True, print_report=False)
    assert ok.verified is True


def test_progress_lines_come_from_one_formatter_after_the_first_every_nth_and_last_step(capsys):
    result = runtime.run(make_plan("tiny-gpt"), "tiny-gpt", steps=7, log_every=3)
    out = capsys.readouterr().out.splitlines()
    lines = [ln for ln in out if ln.startswith("step ") and "/" in ln]
    assert [int(LINE.match(ln).group(1)) for ln in lines] == [1, 3, 6, 7], lines
    assert [float(LINE.match(ln).group(3)) for ln in lines] == [round(result.losses[i - 1], 5) for i in (1, 3, 6, 7)]
    assert out[0].startswith("partita run: tiny-gpt") and out.index(lines[0]) < out.index("step  loss")  # before the report
    runtime.run(make_plan("tiny-gpt"), "tiny-gpt", steps=2, log_every=0)
    assert not [ln for ln in capsys.readouterr().out.splitlines() if LINE.match(ln)]


def test_tensorboard_gets_every_steps_scalars(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    result = runtime.run(make_plan("tiny-gpt"), "tiny-gpt", steps=3, tensorboard=tmp_path, print_report=False)
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert set(events.Tags()["scalars"]) == {"loss", "step_time_s", "tokens_per_s", "memory_bytes"}
    loss = events.Scalars("loss")
    assert [e.step for e in loss] == [1, 2, 3]
    assert [e.value for e in loss] == pytest.approx(result.losses, rel=1e-6)


def test_tensorboard_missing_is_one_line_before_training(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails as if not installed
    with pytest.raises(PartitaError, match=r"--tensorboard needs the tensorboard package, which is not installed: "
                                           r"pip install 'partita\[tensorboard\]'"):
        runtime.run(make_plan("tiny-gpt"), "tiny-gpt", steps=3, tensorboard=tmp_path, print_report=False)
    assert not list(tmp_path.iterdir())


class _Stream:
    def __init__(self, tty: bool):
        self.text, self.tty = "", tty

    def write(self, s: str) -> None:
        self.text += s

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [False, True])
def test_a_progress_bar_only_on_a_terminal(tty):
    import torch

    from partita.runtime.loop.progress import Progress

    stream = _Stream(tty)
    p = Progress(5, 0, 8, "samples", console=True, every=2, stream=stream)
    for step in range(1, 6):
        p.step(step, 1.0 / step, 0.5, torch.device("cpu"))
    p.close()
    kept = [ln.rsplit("\r", 1)[-1].replace("\x1b[K", "") for ln in stream.text.split("\n") if ln]
    assert [ln.split("] ")[-1].split("  ")[0] for ln in kept] == ["step 1/5", "step 2/5", "step 4/5", "step 5/5"]
    assert "samples/s" in kept[0] and "16 samples/s" in kept[0]  # 8 samples in 0.5 s
    assert ("\r[" in stream.text) == tty and ("[##########" in stream.text) == tty  # the bar redrawn in place
    assert kept[-1].endswith("eta 0s") and "eta 2s" in kept[1]  # mean 0.5 s x 3 steps left, from step 2's line
