"""costmodel.models.meta: a model built on meta without its initialisers -- the planner's fingerprint, the
pre-flight and the resume checks -- is the same model by name, shape and dtype, costs no torch._dynamo
import (issue 44: ~1.5 s of every `partita run`'s pre-flight), and leaves torch as it found it."""
from __future__ import annotations

import subprocess
import sys

import torch
import torch.nn as nn

from partita.costmodel import model_fingerprint, resolve_model
from partita.costmodel.models.meta import meta_build, values_skipped_on_meta


def test_the_same_model_without_values():
    spec = resolve_model("tiny-llama")
    meta = meta_build(spec.build)
    assert all(p.is_meta for p in meta.parameters())
    assert model_fingerprint(meta) == model_fingerprint(spec.build())


def test_torch_is_left_as_it_was_and_real_tensors_are_still_filled():
    before = (torch.Tensor.normal_, nn.init.kaiming_uniform_, "normal_" in torch.Tensor.__dict__)
    with values_skipped_on_meta():
        real = torch.zeros(4).normal_()
        assert real.abs().sum() > 0  # only meta tensors skip their fill
        assert torch.empty(3, device="meta").uniform_().is_meta
    assert (torch.Tensor.normal_, nn.init.kaiming_uniform_, "normal_" in torch.Tensor.__dict__) == before


def test_a_meta_build_imports_no_dynamo():
    code = ("import sys; from partita.costmodel import resolve_model; "
            "from partita.runtime.launcher.checks import build_meta; build_meta(resolve_model('tiny-gpt')); "
            "print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr
