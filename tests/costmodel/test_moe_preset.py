"""partita's own mixture-of-experts preset (tiny-moe; `llama:...,experts=E,top_k=k`): priced like transformers'
Mixtral (tests/costmodel/test_hf_families.py) -- a token costs its k experts' MLPs, every expert's weights are in
memory, nothing uncosted -- and it trains in one process."""
import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from partita.costmodel.errors import PartitaError
from partita.costmodel.price.flops import register_missing_formulas
from partita.costmodel.models import resolve_model
from partita.costmodel.models.gpt import MoE
from partita.costmodel.capture import capture

MOE = "tiny-moe"
DENSE = "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=256,seq=32"  # tiny-moe with one dense MLP
TOKENS, HIDDEN, FFN, EXPERTS, TOP_K, LAYERS = 32, 64, 96, 4, 2, 2


def _mlp_flops(graph) -> dict[str, int]:
    out = {"router": 0, "experts": 0, "bwd_experts": 0}
    for _, d in graph.g.nodes(data=True):
        if ".mlp" in d["module"]:
            router = d["module"].endswith(".router")
            out["router" if router else "experts"] += d["fwd_flops"]
            out["bwd_experts"] += 0 if router else d["bwd_flops"]
    return out


@pytest.fixture(scope="module")
def graphs():
    return capture(resolve_model(MOE)), capture(resolve_model(DENSE))


def test_experts_cost_top_k_dense_mlps_and_all_their_weights(graphs):
    moe, dense = graphs
    m, d = _mlp_flops(moe), _mlp_flops(dense)
    assert m["experts"] == TOP_K * d["experts"]                        # k = 2 experts per token, not E = 4
    assert m["bwd_experts"] == TOP_K * d["bwd_experts"]
    assert m["router"] == LAYERS * 2 * TOKENS * HIDDEN * EXPERTS       # the router's Linear
    per_expert = 3 * HIDDEN * FFN
    assert moe.totals()["param_numel"] - dense.totals()["param_numel"] == LAYERS * (
        (EXPERTS - 1) * per_expert + HIDDEN * EXPERTS)                  # every expert, not only the routed ones
    grouped = [d for _, d in moe.g.nodes(data=True) if d["kind"] == "grouped_mm"]
    assert len(grouped) == 2 * LAYERS and all(d["groups"] == EXPERTS for d in grouped)
    assert all(d["bwd_flops"] == 2 * d["fwd_flops"] > 0 for d in grouped)
    assert moe.uncosted_ops() == {}


def test_flops_equal_the_flop_counter_on_a_real_run(graphs):
    spec = resolve_model(MOE)
    torch.manual_seed(0)
    model = spec.build()
    tokens = spec.tokens(1, torch.Generator().manual_seed(0))
    register_missing_formulas()
    with FlopCounterMode(display=False) as fwd:
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1).float(), tokens[:, 1:].flatten())
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    totals = graphs[0].totals()
    assert totals["fwd_flops"] == fwd.get_total_flops()
    assert totals["bwd_flops"] == pytest.approx(bwd.get_total_flops(), rel=0.01)


def test_the_planner_prices_the_experts():
    from partita.planner.api import plan_search
    from partita.planner.enumerate.cp_ep import experts_of
    from partita.planner.search import TrainConfig
    result, p = plan_search(MOE, cluster="4xcpu", train=TrainConfig(global_batch=8, dtype="fp32"))
    g = result.graph
    layer = next(grp for grp in g.groups if grp.startswith("blocks."))
    experts = experts_of(g, layer)
    assert experts is not None and experts.numel == EXPERTS * 3 * HIDDEN * FFN
    assert experts.dispatch_bytes == TOKENS * TOP_K * HIDDEN * 4  # fp32 rows, one way
    assert p.predicted["uncosted_ops"] == {} and p.predicted["step_time_s"] > 0


def test_tiny_moe_trains_in_one_process():
    spec = resolve_model(MOE)
    torch.manual_seed(0)
    model = spec.build()
    assert isinstance(model.blocks[0].mlp, MoE) and model.blocks[0].mlp.experts.gate_up_proj.shape == (
        EXPERTS, 2 * FFN, HIDDEN)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    batch = spec.tokens(8, torch.Generator().manual_seed(0))
    losses = []
    for _ in range(25):
        loss = F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 1.0, losses
    grads = {n: p.grad for n, p in model.named_parameters() if ".mlp." in n}
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values()), grads.keys()


def test_family_strings_take_experts_and_top_k():
    spec = resolve_model("llama:layers=1,hidden=32,heads=2,vocab=64,seq=8,ffn=40,experts=8,top_k=1")
    assert spec.config["experts"] == 8 and spec.config["top_k"] == 1
    with torch.device("meta"):
        mlp = spec.build().blocks[0].mlp
    assert isinstance(mlp, MoE) and mlp.top_k == 1 and mlp.experts.down_proj.shape == (8, 32, 40)
    assert resolve_model("llama:layers=1,hidden=32,heads=2,vocab=64,seq=8").config["experts"] == 0  # dense


@pytest.mark.parametrize("spec,needle", [
    ("gpt:layers=1,hidden=32,heads=2,vocab=64,seq=8,experts=4", "needs family 'llama'"),
    ("llama:layers=1,hidden=32,heads=2,vocab=64,seq=8,experts=4,top_k=5", "top_k must be between 1 and experts"),
    ("llama:layers=1,hidden=32,heads=2,vocab=64,seq=8,experts=-1", "experts must be 0"),
])
def test_bad_moe_strings_are_one_line(spec, needle):
    with pytest.raises(PartitaError) as e:
        resolve_model(spec)
    assert needle in str(e.value) and "\n" not in str(e.value)
