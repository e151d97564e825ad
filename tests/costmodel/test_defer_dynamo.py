"""costmodel.capture.defer: the fx capture runs without importing torch._dynamo, and changes nothing else.

Each case is a fresh interpreter (the test process has torch._dynamo loaded long since):
- a capture with the stand-in, and a build on the meta device (the plan's fingerprint), leave torch._dynamo
  unimported, and the capture gives the graph a process that imported
  torch._dynamo first gives (every node, edge and field; the capture's own seconds and object addresses aside),
  for a small llama in bf16 (rotary embeddings, grouped-query attention, autocast records);
- after it, `import torch._dynamo` is torch's own, whole: torch.compile compiles and runs a function, and a
  function `disable`d by the stand-in before then goes through torch's real disable.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CAPTURE = r"""
import json, os, sys
os.environ["PARTITA_CACHE_DIR"] = "off"
import torch
if sys.argv[2] == "dynamo-first":
    import torch._dynamo
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture, cache
from partita.costmodel.models.meta import meta_build
g = capture(resolve_model(sys.argv[1]), dtype="bf16")
meta_build(resolve_model(sys.argv[1]).build)  # the plan's fingerprint: a rotary table's arange on meta
print(json.dumps({"dynamo_loaded": "torch._dynamo" in sys.modules, "graph": cache.encode(cache._graph_data(g))}))
"""

AFTER = r"""
import sys
import torch
from partita.costmodel.capture import defer
with defer.deferred() as standing:
    assert standing and isinstance(sys.modules["torch._dynamo"], defer.StandIn)
    seen = []
    wrapped = torch._dynamo.disable(lambda x: seen.append(x) or x + 1)
    assert wrapped(1) == 2
assert "torch._dynamo" not in sys.modules and "torch._dynamo.config" not in sys.modules
import torch._dynamo
assert not isinstance(torch._dynamo, defer.StandIn) and hasattr(torch._dynamo, "optimize")
compiled = torch.compile(lambda x: torch.sin(x) * 2, backend="eager")
x = torch.randn(4)
assert torch.equal(compiled(x), torch.sin(x) * 2)
asked, real_disable = [], torch._dynamo.disable
torch._dynamo.disable = lambda fn, recursive=True, **kw: asked.append(fn) or real_disable(fn, recursive, **kw)
assert wrapped(2) == 3 and wrapped(3) == 4 and seen == [1, 2, 3]
assert len(asked) == 1  # torch's own disabled copy, made once, on the first call after the import
print("ok")
"""


def _run(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("model", ["llama:layers=2,hidden=64,heads=4,kv_heads=2,vocab=128,seq=16"])
def test_the_deferred_capture_leaves_dynamo_out_and_gives_the_same_graph(model):
    deferred, first = (json.loads(_run(CAPTURE, model, how)) for how in ("deferred", "dynamo-first"))
    assert not deferred["dynamo_loaded"] and first["dynamo_loaded"]
    def strip(text: str) -> str:  # object addresses in node targets, and the capture's own seconds
        return re.sub(r'"capture_seconds",[0-9.e-]+', "", re.sub(r"0x[0-9a-f]+", "0x", text))
    assert strip(deferred["graph"]) == strip(first["graph"])


def test_after_the_capture_torch_dynamo_is_torchs_own_and_disable_goes_through_it():
    assert _run(AFTER) == "ok"
