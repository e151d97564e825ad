"""`package.module:factory` models: planned on meta/fake tensors, with the HF capture patches wherever an
HF model sits inside the user's module; the runtime's `build()` still gets real parameters."""
import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from partita.costmodel import PartitaError
from partita.costmodel.models import resolve_model
from partita.planner.api import plan
from partita.planner.enumerate.space import TrainConfig

_RECORDING_FACTORY = '''
import torch
from partita.costmodel.models.gpt import GPT, GPTConfig

CALLS = []  # (default device, parameter device, parameter is a FakeTensor) per call

def factory():
    model = GPT(GPTConfig(layers=2, hidden=64, heads=4, vocab=256, seq=32))
    p = next(model.parameters())
    CALLS.append((torch.get_default_device().type, p.device.type, type(p.data).__name__ == "FakeTensor"))
    return model, (torch.randint(0, 256, (2, 32)),)
'''


def _module(tmp_path, monkeypatch, name: str, source: str) -> str:
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    return name


def test_planning_a_factory_allocates_no_parameters_but_the_runtime_build_does(tmp_path, monkeypatch):
    name = _module(tmp_path, monkeypatch, "partita_recording_factory", _RECORDING_FACTORY)
    p = plan(f"{name}:factory", cluster="4xcpu", train=TrainConfig(global_batch=4))
    assert p.predicted["step_time_s"] > 0
    calls = sys.modules[name].CALLS
    assert calls, "the factory was never called"
    # every call made while planning built meta or fake parameters: none held memory
    assert all(param == "meta" or fake for _, param, fake in calls), calls
    real = resolve_model(f"{name}:factory").build()   # as the runtime builds it: real parameters
    p0 = next(real.parameters())
    assert p0.device.type == "cpu" and not isinstance(p0, FakeTensor) and p0.abs().sum() > 0


_BIG_FACTORY = '''
import torch
from partita.costmodel.models.gpt import GPT, GPTConfig

def factory():  # 0.87B parameters: 3.5 GB if allocated in fp32
    model = GPT(GPTConfig(layers=16, hidden=2048, heads=16, vocab=32000, seq=128))
    return model, (torch.zeros(1, 128, dtype=torch.long),)
'''

_MEASURE = '''
import json, resource, sys
sys.path.insert(0, sys.argv[1])
from partita.planner.api import plan
from partita.planner.enumerate.space import TrainConfig
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
p = plan("partita_big_factory:factory", cluster="8xA100-80GB", train=TrainConfig(global_batch=8))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"delta_kib": after - before, "parameters": p.model["parameters"]}))
'''


def test_planning_a_big_factory_model_does_not_grow_memory_by_its_size(tmp_path):
    (tmp_path / "partita_big_factory.py").write_text(textwrap.dedent(_BIG_FACTORY))
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(tmp_path)], capture_output=True, text=True,
                         timeout=600, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
                                           "PYTHONPATH": str(__import__("pathlib").Path(__file__).parents[2])})
    assert out.returncode == 0, out.stderr[-2000:]
    d = json.loads(out.stdout.strip().splitlines()[-1])
    weights = 4 * d["parameters"]
    assert weights > 3e9
    assert d["delta_kib"] * 1024 < weights / 4, d   # far below the 3.5 GB a real build would take


_WRAPPED_LLAMA = '''
import torch
import torch.nn as nn
import transformers


class Trainer(nn.Module):
    """A user's module holding an HF model (use_cache left at its default, True)."""

    def __init__(self):
        super().__init__()
        cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=128, intermediate_size=352,
                                       num_attention_heads=4, num_key_value_heads=2, vocab_size=1024,
                                       max_position_embeddings=64)
        self.lm = transformers.LlamaForCausalLM(cfg)

    def forward(self, input_ids, labels):
        return self.lm(input_ids=input_ids, labels=labels).loss


def factory():
    ids = torch.zeros(2, 64, dtype=torch.long)
    return Trainer(), (ids, ids.clone())
'''


def test_an_hf_model_inside_a_factory_plans_as_the_bare_hf_model(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    name = _module(tmp_path, monkeypatch, "partita_wrapped_llama", _WRAPPED_LLAMA)
    train = TrainConfig(global_batch=64, dtype="bf16")
    bare = plan("hf:llama", cluster="8xA100-80GB", train=train)
    wrapped = plan(f"{name}:factory", cluster="8xA100-80GB", train=train)
    assert wrapped.model["parameters"] == bare.model["parameters"]
    assert wrapped.predicted["step_time_s"] == pytest.approx(bare.predicted["step_time_s"], rel=0.01)
    assert json.dumps(wrapped.predicted["uncosted_ops"]) == "{}"


_LOSS_FACTORY = '''
import torch
import torch.nn as nn
import torch.nn.functional as F

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(12, 12) for _ in range(2))
        self.head = nn.Linear(12, 5)

    def forward(self, x):
        for b in self.blocks:
            x = torch.relu(b(x))
        return self.head(x)

CALLED = []

def loss(module, x, labels):
    CALLED.append(x.shape[0])
    return F.cross_entropy(module(x), labels)

def factory():
    return Net(), (torch.zeros(1, 12), torch.zeros(1, dtype=torch.long)), loss

def bad():
    return Net(), (torch.zeros(1, 12),), "not a function"
'''


def test_a_factory_may_carry_its_loss(tmp_path, monkeypatch):
    """Issue 30 item 2: `(module, example_inputs, loss_fn)`: the loss is captured with the model and is what the
    runtime trains; synthetic labels are drawn below the classifier head's 5 outputs."""
    name = _module(tmp_path, monkeypatch, "partita_loss_factory", _LOSS_FACTORY)
    spec = resolve_model(f"{name}:factory")
    assert spec.loss_fn is sys.modules[name].loss and spec.config == {"classes": 5} and spec.vocab is None
    p = plan(spec, cluster="2xcpu", train=TrainConfig(global_batch=4))
    assert p.predicted["step_time_s"] > 0 and sys.modules[name].CALLED  # the loss was part of the capture
    from partita.runtime.data import make_data
    x, labels = make_data(spec, 64).batch(0)
    assert x.shape == (64, 12) and labels.dtype == torch.long and 0 <= int(labels.min()) and int(labels.max()) == 4
    with pytest.raises(PartitaError, match=r"must return \(nn.Module, example_inputs tuple\) or \(nn.Module, "
                                           r"example_inputs tuple, loss_fn\)"):
        resolve_model(f"{name}:bad")


def test_a_factory_model_without_loss_or_vocabulary_is_told_the_contract(tmp_path, monkeypatch):
    """A ResNet-like factory returning (module, example_inputs) plans, but the runtime has no loss to train it
    with: the line names the three-part contract that fixes it."""
    from partita.runtime.data import make_data
    name = _module(tmp_path, monkeypatch, "partita_lossless_factory",
                   _LOSS_FACTORY.replace("def factory():\n    return Net(), (torch.zeros(1, 12), torch.zeros(1, "
                                         "dtype=torch.long)), loss", "def factory():\n    return Net(), "
                                         "(torch.zeros(1, 12),)"))
    with pytest.raises(PartitaError, match=r"a model factory returns \(module, example_inputs, loss_fn\) to train "
                                           r"with its loss"):
        make_data(resolve_model(f"{name}:factory"), 8)


def test_a_compiled_factory_model_is_planned_under_its_own_names(tmp_path, monkeypatch):
    """Issue 46: a factory returning `torch.compile(model)` gave plans whose layers read `_orig_mod.layers.0-3`.
    The model itself is planned and built (costmodel.models.registry.original_module), under its own names."""
    name = _module(tmp_path, monkeypatch, "partita_compiled_factory", _LOSS_FACTORY.replace(
        "return Net(), (torch.zeros(1, 12), torch.zeros(1, dtype=torch.long)), loss",
        "return torch.compile(Net()), (torch.zeros(1, 12), torch.zeros(1, dtype=torch.long)), loss"))
    spec = resolve_model(f"{name}:factory")
    built = spec.build()
    assert type(built).__name__ == "Net" and not any("_orig_mod" in n for n, _ in built.named_parameters())
    p = plan(spec, cluster="2xcpu", train=TrainConfig(global_batch=4))
    assert "_orig_mod" not in p.canonical_json()
