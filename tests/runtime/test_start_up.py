"""What each process of a launch imports before it does anything (every `partita run` starts three kinds:
the CLI, torchrun's agent, the workers). On this 2-core machine torch alone takes ~2.5 s, DTensor/FSDP/DCP
~1.5 s more and torch.distributed.pipelining (torch._dynamo with it) ~1 s more, per process."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _loaded(code: str, modules: list[str]) -> dict[str, bool]:
    probe = f"import sys, json\n{code}\nprint(json.dumps({{m: m in sys.modules for m in {modules!r}}}))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_the_cli_parses_and_launches_without_torch():
    assert _loaded("import partita.cli", ["torch"]) == {"torch": False}


def test_building_every_commands_flags_loads_no_pricing():
    """Every `partita` command builds the whole parser (flags generated from the planner's dataclasses): that must
    not pull in torch, the fusion pricing's graph library or the solvers (`partita models` is ~0.2 s)."""
    loaded = _loaded("import partita.cli; partita.cli.build_parser()", ["torch", "networkx", "cvxpy", "highspy"])
    assert loaded == {"torch": False, "networkx": False, "cvxpy": False, "highspy": False}


@pytest.mark.parametrize("code", ["import partita.runtime.train, partita.runtime.api",
                                  "from partita.runtime.api import agent_main"])
def test_the_launcher_loads_neither_the_training_session_nor_the_pipeline_library(code):
    assert _loaded(code, ["partita.runtime.loop.session", "torch.distributed.tensor", "torch._dynamo"]) == \
        {"partita.runtime.loop.session": False, "torch.distributed.tensor": False, "torch._dynamo": False}


def test_a_worker_without_a_pipeline_does_not_load_the_pipeline_library():
    loaded = _loaded("import partita.runtime.train, partita.runtime.loop.session", ["torch.distributed.pipelining"])
    assert loaded == {"torch.distributed.pipelining": False}


def test_a_process_ends_without_module_teardown_but_loses_nothing(tmp_path):
    """runtime.train.exit_now (every launch process ends with it): the exit code is kept, buffered output still
    reaches the pipe, atexit handlers run and a non-daemon thread finishes, as under a normal interpreter exit."""
    code = f"""
import atexit, sys, threading, time
from pathlib import Path
from partita.runtime.train import exit_now
out = Path({str(tmp_path)!r})
atexit.register(lambda: (out / "atexit").write_text("ran"))
def late():
    time.sleep(0.5)
    (out / "thread").write_text("done")
threading.Thread(target=late).start()
sys.stdout.write("buffered, no newline")
sys.stderr.write("err line")
exit_now(5)
print("never")
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered, as usual
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 5, proc.stderr
    assert proc.stdout == "buffered, no newline" and proc.stderr == "err line"
    assert (tmp_path / "atexit").read_text() == "ran" and (tmp_path / "thread").read_text() == "done"
