"""HuggingFace models captured with torch.export into the same OpGraph as symbolic_trace gives.

Every model is built from its transformers config class (no downloads). Fidelity is checked against
real runs of the same model: FLOPs against FlopCounterMode, saved activations against saved-tensor hooks.
"""
import dataclasses

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

pytest.importorskip("transformers")

from partita.costmodel.errors import PartitaError  # noqa: E402
from partita.costmodel.price.flops import register_missing_formulas  # noqa: E402
from partita.costmodel.hardware import parse_cluster  # noqa: E402
from partita.costmodel.models import ModelSpec, resolve_model, with_seq  # noqa: E402
from partita.costmodel.models.hf import parse  # noqa: E402
from partita.costmodel.capture import capture  # noqa: E402
from partita.planner.enumerate.strategies import tensor_option  # noqa: E402
from tests.conftest import measured_saved_bytes

HF = ["hf:gpt2", "hf:llama", "hf:bert", "hf:t5"]
_ATTRS = {"op", "target", "kind", "module", "group", "shape", "dtype", "out_bytes", "fwd_flops", "bwd_flops",
          "saved_bytes", "alias", "mem_bytes", "params", "param_bytes"}


def _real_batch(spec: ModelSpec, model):
    ids, _ = spec.example_inputs(1)
    ids = torch.randint(0, model.config.vocab_size, ids.shape, generator=torch.Generator().manual_seed(0))
    return ids, ids.clone()


def _real_model(spec: ModelSpec):
    torch.manual_seed(0)
    model = spec.build()
    model.train()
    return model


@pytest.mark.parametrize("name", HF)
def test_flops_equal_flop_counter_on_a_real_run(name, graph_of):
    """Exactly equal: the same ATen ops run (attention unmasked, as eager training on an unpadded batch)."""
    register_missing_formulas()
    spec = resolve_model(name)
    model = _real_model(spec)
    batch = _real_batch(spec, model)
    with FlopCounterMode(display=False) as fwd:
        loss = spec.loss_fn(model, *batch)
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    totals = graph_of(name).totals()
    assert fwd.get_total_flops() > 0
    assert totals["fwd_flops"] == fwd.get_total_flops()
    assert totals["bwd_flops"] == bwd.get_total_flops()


@pytest.mark.parametrize("name", HF)
def test_saved_activation_bytes_match_saved_tensor_hooks(name, graph_of):
    spec = resolve_model(name)
    model = _real_model(spec)
    batch = _real_batch(spec, model)
    measured = measured_saved_bytes(model, lambda: spec.loss_fn(model, *batch))
    predicted = graph_of(name).totals()["saved_bytes"]
    assert measured > 0
    assert abs(predicted - measured) / measured <= 0.02, (predicted, measured)


@pytest.mark.parametrize("name", HF)
def test_parameters_are_counted_once_under_the_users_names(name, graph_of):
    g = graph_of(name)
    model = _real_model(resolve_model(name))
    names = dict(model.named_parameters())  # tied weights appear once, under their first name
    owned = {p: n for n, d in g.g.nodes(data=True) for p in d["params"]}
    assert set(owned) == set(names)
    assert g.totals()["param_numel"] == sum(p.numel() for p in names.values())
    for _, d in g.g.nodes(data=True):
        assert _ATTRS <= set(d), _ATTRS - set(d)
        assert d["param_bytes"] == sum(names[p].numel() * names[p].element_size() for p in d["params"])


@pytest.mark.parametrize("name, layers", [
    ("hf:gpt2", [f"transformer.h.{i}" for i in range(2)]),
    ("hf:llama", [f"model.layers.{i}" for i in range(2)]),
    ("hf:bert", [f"bert.encoder.layer.{i}" for i in range(2)]),
])
def test_layers_are_grouped_by_fqn_and_detected_as_repeated(name, layers, graph_of):
    g = graph_of(name)
    assert g.repeated() == layers
    assert all(grp in g.groups for grp in layers)
    # ops HF runs in the model that holds the layers (GPT2Model's mask and view) do not form a group
    assert "transformer" not in g.groups and "model" not in g.groups
    assert g.groups.index(layers[0]) > 0 and g.groups.index(layers[-1]) < len(g.groups) - 1


def test_gpt2_conv1d_is_a_linear_with_its_weight_stored_in_out(graph_of):
    g = graph_of("hf:gpt2")
    nodes = {d["module"]: d for _, d in g.g.nodes(data=True) if d["kind"] == "linear"}
    c_attn = nodes["transformer.h.0.attn.c_attn"]
    assert c_attn["op"] == "call_module" and c_attn["weight_layout"] == "in_out"
    assert c_attn["params"] == {"transformer.h.0.attn.c_attn.weight": 128 * 384,
                                "transformer.h.0.attn.c_attn.bias": 384}
    assert c_attn["fwd_flops"] == 2 * 64 * 128 * 384 and c_attn["bwd_flops"] == 2 * c_attn["fwd_flops"]
    assert nodes["lm_head"]["weight_layout"] == "out_in"
    assert nodes["lm_head"]["params"] == {}  # tied to transformer.wte.weight, counted at the embedding


def test_llama_tensor_parallel_split_is_derived_from_the_export_graph(graph_of):
    g = graph_of("hf:llama")
    layer = g.repeated()[0]
    opt = tensor_option(g, layer, parse_cluster("8xA100-80GB"), 2)
    assert opt is not None
    col = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"}
    row = {"self_attn.o_proj", "mlp.down_proj"}
    assert opt.placements == {**{f"{layer}.{m}": "colwise" for m in col}, **{f"{layer}.{m}": "rowwise" for m in row}}
    norms = 2 * 128  # input_layernorm and post_attention_layernorm weights stay whole
    assert opt.param_numel == (g.group_cost(layer).param_numel - norms) // 2 + norms
    assert len(opt.tp_comm_bytes_fwd) == 2  # one all-reduce after o_proj, one after down_proj


def test_export_and_symbolic_trace_give_the_same_costs_for_the_same_model():
    """Our own GPT captured both ways: same totals, groups, repeated layers and tensor-parallel split."""
    spec = resolve_model("tiny-llama")
    fx_graph = capture(spec)
    ex_graph = capture(dataclasses.replace(spec, capture="export"))
    a, b = fx_graph.totals(), ex_graph.totals()
    for key in ("fwd_flops", "bwd_flops", "saved_bytes", "param_numel", "param_bytes"):
        assert a[key] == b[key], key
    assert fx_graph.groups == ex_graph.groups and fx_graph.repeated() == ex_graph.repeated()
    cl = parse_cluster("8xA100-80GB")
    assert (tensor_option(fx_graph, "blocks.0", cl, 2).placements
            == tensor_option(ex_graph, "blocks.0", cl, 2).placements)
    for grp in fx_graph.groups:
        assert fx_graph.group_cost(grp).saved_bytes == ex_graph.group_cost(grp).saved_bytes, grp


def test_overrides_are_parsed_and_applied():
    arch, over = parse("hf:llama:num_hidden_layers=3,hidden_size=64,rms_norm_eps=1e-5,tie_word_embeddings=true,seq=16")
    assert arch == "llama"
    assert over == {"num_hidden_layers": 3, "hidden_size": 64, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
                    "seq": 16}
    spec = resolve_model("hf:llama:num_hidden_layers=3,hidden_size=64,seq=16")
    assert spec.seq_len == 16 and spec.config["num_hidden_layers"] == 3
    with torch.device("meta"):
        model = spec.build()
    assert len(model.model.layers) == 3 and model.config.use_cache is False
    assert with_seq(spec, 32).seq_len == 32
    with pytest.raises(PartitaError, match="no attribute 'hidden'"):
        resolve_model("hf:llama:hidden=64")
    with pytest.raises(PartitaError, match="accepted: hf:gpt2"):
        resolve_model("hf:gpt5")
    with pytest.raises(PartitaError, match="use_cache"):
        resolve_model("hf:gpt2:use_cache=true")


def test_bf16_capture_holds_bf16_parameters(graph_of):
    g = graph_of("hf:llama", "bf16")
    assert g.totals()["param_bytes"] == 2 * g.totals()["param_numel"]
    assert g.totals()["fwd_flops"] == graph_of("hf:llama").totals()["fwd_flops"]


def test_an_encoder_decoder_has_a_group_per_layer_of_both_stacks():
    """T5's encoder layers are groups of their own, as the decoder's are, so a pipeline stage boundary can
    fall inside the encoder (before, the encoder was one group: only the stack with most operators was)."""
    g = capture(resolve_model("hf:t5"))
    assert set(g.layer_containers) == {"encoder.block", "decoder.block"}
    for stack in ("encoder.block", "decoder.block"):
        layers = [grp for grp in g.groups if grp.startswith(stack + ".")]
        assert len(layers) == 2 and all(g.group_cost(grp).fwd_flops > 0 for grp in layers)
    order = g.groups
    assert order.index("encoder.block.1") < order.index("decoder.block.0")  # graph order: encoder first


def test_torch_export_capture_records_a_tied_head_as_symbolic_trace_does():
    """GPT-2's LM head is its token embedding: torch.export lifts the tensor once, and the head's node
    records the tie (the planner charges a tied weight split over pipeline stages from it)."""
    g = capture(resolve_model("hf:gpt2:n_layer=2,n_embd=64,n_head=4"))
    ties = [d["tied"] for _, d in g.g.nodes(data=True) if d.get("tied")]
    assert ties == [{"lm_head.weight": "transformer.wte.weight"}]
    counted = [n for _, d in g.g.nodes(data=True) for n in d["params"]]
    assert "transformer.wte.weight" in counted and "lm_head.weight" not in counted  # its bytes once
