"""CNNs through the symbolic_trace capture, and models neither front end can capture.

Convolution FLOPs are checked three ways: against FlopCounterMode on a real forward + backward, against
the closed form 2 * C_out * C_in * k^2 * H_out * W_out, and against torchvision's published ResNet-50
numbers (25,557,032 parameters, 4.09 GMACs per 224x224 image).
"""
import pytest
import torch
import torch.nn as nn
from torch.utils.flop_counter import FlopCounterMode

from partita.costmodel.errors import PartitaError
from partita.costmodel.price.flops import register_missing_formulas
from partita.costmodel.models import ModelSpec, resolve_model
from partita.costmodel.capture import capture
from tests.conftest import measured_saved_bytes

CNNS = ["tiny-resnet", "resnet:depth=50,width=16,image=64,classes=10"]


def _real(name):
    spec = resolve_model(name)
    torch.manual_seed(0)
    model = spec.build()
    images, labels = spec.example_inputs(1)
    images = torch.randn(images.shape, generator=torch.Generator().manual_seed(0))
    return spec, model, images, labels


@pytest.mark.parametrize("name", CNNS)
def test_flops_equal_flop_counter_on_a_real_run(name, graph_of):
    register_missing_formulas()
    spec, model, images, labels = _real(name)
    with FlopCounterMode(display=False) as fwd:
        loss = spec.loss_fn(model, images, labels)
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    totals = graph_of(name).totals()
    assert totals["fwd_flops"] == fwd.get_total_flops() > 0
    # the first convolution computes no gradient for the images: the backward is less than 2x forward
    assert totals["bwd_flops"] == bwd.get_total_flops() < 2 * totals["fwd_flops"]


@pytest.mark.parametrize("name", CNNS)
def test_saved_activation_bytes_match_saved_tensor_hooks(name, graph_of):
    spec, model, images, labels = _real(name)
    measured = measured_saved_bytes(model, lambda: spec.loss_fn(model, images, labels))
    predicted = graph_of(name).totals()["saved_bytes"]
    assert abs(predicted - measured) / measured <= 0.02, (predicted, measured)


def test_convolution_flops_follow_the_closed_form(graph_of):
    g = graph_of("tiny-resnet")  # 32x32 images, width 16, 3x3 stride-1 stem
    by_module = {d["module"]: d for _, d in g.g.nodes(data=True) if d["kind"] == "conv2d"}
    stem = by_module["stem.conv"]
    assert stem["op"] == "call_module" and stem["params"] == {"stem.conv.weight": 16 * 3 * 3 * 3}
    assert stem["fwd_flops"] == 2 * 16 * 3 * 3 * 3 * 32 * 32
    assert stem["bwd_flops"] == stem["fwd_flops"]  # grad weight only: the images need no gradient
    conv = by_module["blocks.0.conv1"]
    assert conv["fwd_flops"] == 2 * 16 * 16 * 3 * 3 * 32 * 32 and conv["bwd_flops"] == 2 * conv["fwd_flops"]
    down = by_module["blocks.2.down.0"]  # stage 2 halves the resolution: 1x1 stride-2 projection 16 -> 32
    assert down["fwd_flops"] == 2 * 32 * 16 * 16 * 16


def test_resnet50_matches_torchvision_and_groups_its_blocks(graph_of):
    g = graph_of("resnet50")
    totals = g.totals()
    assert totals["param_numel"] == 25_557_032
    assert abs(totals["fwd_flops"] / 2 - 4.09e9) / 4.09e9 < 0.01
    assert g.groups == ["stem", *[f"blocks.{i}" for i in range(16)], "pool", "fc"]
    assert g.repeated() == [f"blocks.{i}" for i in range(8, 13)]  # stage 3's blocks after its first
    assert g.boundary_bytes("blocks.2") == 256 * 56 * 56 * 4


def test_bf16_capture_builds_images_in_the_training_dtype(graph_of):
    g = graph_of("tiny-resnet", "bf16")
    assert g.totals()["param_bytes"] == 2 * g.totals()["param_numel"]
    assert g.totals()["fwd_flops"] == graph_of("tiny-resnet").totals()["fwd_flops"]


# models symbolic_trace cannot capture -------------------------------------------------------------

class _ValueGate(nn.Module):
    """Branches on a tensor's value: neither symbolic_trace nor torch.export can capture it."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        if x.sum() > 0:
            return self.a(x)
        return self.b(x)


class _ShapeGate(nn.Module):
    """Branches on a shape: symbolic_trace fails, torch.export (the fallback) follows it."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 8)

    def forward(self, x):
        return self.a(x).relu() if x.shape[1] > 4 else self.a(x)


class _Net(nn.Module):
    def __init__(self, gate):
        super().__init__()
        self.body = nn.ModuleList([nn.Linear(8, 8), gate()])

    def forward(self, x):
        for m in self.body:
            x = m(x)
        return x


def _spec(gate, **kw) -> ModelSpec:
    return ModelSpec(name=gate.__name__, build=lambda: _Net(gate),
                     example_inputs=lambda b: (torch.zeros(b, 16, 8),), **kw)


def test_value_dependent_control_flow_names_the_module_and_what_to_try():
    with pytest.raises(PartitaError) as err:
        capture(_spec(_ValueGate))
    msg = str(err.value)
    assert "module 'body.1' (_ValueGate)" in msg
    assert "control flow depends on tensor values" in msg
    assert "torch.fx.symbolic_trace" in msg and "torch.export" in msg  # both front ends were tried
    assert "make the control flow static" in msg


def test_symbolic_trace_alone_suggests_torch_export():
    with pytest.raises(PartitaError, match=r"module 'body\.1' \(_ValueGate\).*capture='export'"):
        capture(_spec(_ValueGate, capture="fx"))


def test_shape_dependent_control_flow_falls_back_to_torch_export():
    with pytest.raises(PartitaError, match="body.1"):
        capture(_spec(_ShapeGate, capture="fx"))
    g = capture(_spec(_ShapeGate))
    assert g.groups == ["body.0", "body.1"]
    assert g.totals()["fwd_flops"] == 2 * (2 * 16 * 8 * 8)
    assert [d["kind"] for _, d in g.g.nodes(data=True) if d["op"] == "call_module"] == ["linear", "linear"]
