"""What each process of a launch imports before it does anything (every `partita run` starts three kinds:
the CLI, torchrun's agent, the workers). On this 2-core machine torch alone takes ~2.5 s, DTensor/FSDP/DCP
~1.5 s more and torch.distributed.pipelining (torch._dynamo with it) ~1 s more, per process."""
import json
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
    assert _loaded("import partita.planner.cli", ["torch"]) == {"torch": False}


@pytest.mark.parametrize("code", ["import partita.runtime.train, partita.runtime.api",
                                  "from partita.runtime.api import agent_main"])
def test_the_launcher_loads_neither_the_training_session_nor_the_pipeline_library(code):
    assert _loaded(code, ["partita.runtime.session", "torch.distributed.tensor", "torch._dynamo"]) == \
        {"partita.runtime.session": False, "torch.distributed.tensor": False, "torch._dynamo": False}


def test_a_worker_without_a_pipeline_does_not_load_the_pipeline_library():
    loaded = _loaded("import partita.runtime.train, partita.runtime.session", ["torch.distributed.pipelining"])
    assert loaded == {"torch.distributed.pipelining": False}
