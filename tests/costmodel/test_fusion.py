"""costmodel.price.fusion: a compiled run prices each connected run of memory-bound operators as one kernel that
moves only its external bytes and saves no tensor that never leaves its group (as AOTAutograd's
partitioner, checked against a real torch.compile'd block); matmuls and attention are untouched; groups
never make the graph cyclic. A compiled plan is predicted faster and smaller than the same plan run
eagerly, says so, and the runtime takes it (tests/e2e compiles and verifies one)."""
from __future__ import annotations

import networkx as nx
import pytest

from partita.costmodel.errors import PartitaError
from partita.costmodel.price.fusion import compiled, fusion_groups, group_bytes, is_layer
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture
from partita.planner.api import plan
from partita.planner.enumerate.candidates import split_model
from partita.planner.plan.explain import explain
from partita.planner.plan import Plan, PlanError
from partita.planner.enumerate.space import SearchSpace, TrainConfig
from partita.planner.enumerate.strategies import launches, node_seconds
from partita.runtime.parallel.blocks import is_layer as runtime_is_layer
from partita.runtime.launcher.checks import preflight

LLAMA = "llama:layers=3,hidden=256,heads=8,kv_heads=4,seq=256,vocab=512"
GPT = "gpt:layers=3,hidden=256,heads=8,seq=256,vocab=512"


@pytest.fixture(scope="module", params=[LLAMA, GPT])
def graph(request):
    return capture(resolve_model(request.param), dtype="bf16")


def _layer(graph):
    return split_model(graph)[1][1]


def _kinds(graph, members):
    return [graph.g.nodes[n]["kind"] for n in members]


def test_groups_contracted_leave_the_graph_acyclic(graph):
    """Each group must be one kernel: no path may leave a group and come back (the residual add after the
    MLP cannot fuse with the norm whose output feeds the MLP)."""
    groups = fusion_groups(graph)
    assert any(sum(not graph.g.nodes[n]["alias"] for n in m) > 1 for m in groups)  # something fused
    where = {n: i for i, m in enumerate(groups) for n in m}
    contracted = nx.DiGraph()
    for u, v in graph.g.edges:
        a, b = where.get(u, u), where.get(v, v)
        if a != b:
            contracted.add_edge(a, b)
    assert nx.is_directed_acyclic_graph(contracted)
    for m in groups:  # and a group stays inside one layer (compile wraps each block)
        assert len({graph.g.nodes[n]["group"] for n in m}) == 1


def test_a_norm_is_one_kernel_reading_its_input_and_weight_and_writing_its_output(graph):
    g = graph.g
    layer = _layer(graph)
    norm = next(m for m in fusion_groups(graph) if g.nodes[m[0]]["group"] == layer
                and ("mean" in _kinds(graph, m) or "layernorm" in _kinds(graph, m)))
    kernels = [n for n in norm if not g.nodes[n]["alias"]]
    outside = {p for n in norm for p in g.predecessors(n) if p not in norm}
    written = [n for n in kernels if any(s not in norm for s in g.successors(n))]
    expected = sum(g.nodes[p]["out_bytes"] for p in outside) + sum(g.nodes[n]["out_bytes"] for n in written)
    assert group_bytes(graph, norm) == expected
    eager = sum(g.nodes[n]["mem_bytes"] for n in kernels)
    if len(kernels) > 1:  # an RMSNorm written as six ops moves several activations more in eager
        assert group_bytes(graph, norm) < eager / 2


def test_a_group_of_views_alone_runs_no_kernel(graph):
    views = [m for m in fusion_groups(graph) if all(graph.g.nodes[n]["alias"] for n in m)]
    assert views  # q/k/v reshapes between a Linear and attention
    assert all(group_bytes(graph, m) == 0 for m in views)


def test_compiled_prices_memory_bound_ops_lower_and_keeps_the_rest(graph):
    cg = compiled(graph)
    cluster = parse_cluster("1x8xH100-80GB")
    assert cg.repeated() == graph.repeated()  # layers stay copies of one another
    assert cg.totals()["fwd_flops"] == graph.totals()["fwd_flops"]
    assert cg.totals()["saved_bytes"] <= graph.totals()["saved_bytes"]
    layer = _layer(graph)
    t = {}
    for name, gr in (("eager", graph), ("compiled", cg)):
        nodes = [gr.g.nodes[n] for n in gr.nodes_of(layer)]
        heavy = [d for d in nodes if d["kind"] in ("linear", "scaled_dot_product_attention")]
        light = [d for d in nodes if d not in heavy]
        t[name] = (sum(node_seconds(d, cluster, "bf16").fwd for d in heavy),
                   sum(node_seconds(d, cluster, "bf16").fwd for d in light),
                   sum(launches(d) for d in nodes))
    assert t["compiled"][0] == t["eager"][0]       # GEMMs and attention as they were
    assert t["compiled"][1] < t["eager"][1]         # elementwise and norms: fewer bytes
    if any(d["kind"] == "mean" for _, d in graph.g.nodes(data=True)):  # RMSNorm and RoPE written out op by op
        assert t["compiled"][1] < 0.6 * t["eager"][1]
    assert t["compiled"][2] < t["eager"][2]         # and fewer launches
    assert graph.g.graph.get("kernels") is None     # the captured graph itself is untouched


def test_a_fused_group_saves_only_what_leaves_it(graph):
    """silu(gate) and x * rsqrt live only inside their groups: compile saves neither. A norm's output,
    which the next matmul saves, and every matmul's and attention's saved bytes stay."""
    cg = compiled(graph)
    g, c = graph.g, cg.g
    groups = fusion_groups(graph)
    for m in groups:
        for n in m:
            if c.nodes[n]["saved_bytes"] != g.nodes[n]["saved_bytes"]:
                assert c.nodes[n]["saved_bytes"] == 0
                assert all(s in m for s in g.successors(n))  # only a tensor that stays inside is dropped
    fused = {n for m in groups for n in m}
    assert all(c.nodes[n]["saved_bytes"] == g.nodes[n]["saved_bytes"] for n in g.nodes if n not in fused)
    layer = _layer(graph)
    if any(g.nodes[n]["kind"] == "silu" for n in graph.nodes_of(layer)):
        silu = next(n for n in graph.nodes_of(layer) if g.nodes[n]["kind"] == "silu")
        assert g.nodes[silu]["saved_bytes"] > 0 and c.nodes[silu]["saved_bytes"] == 0
        assert sum(c.nodes[n]["saved_bytes"] for n in graph.nodes_of(layer)) < \
            0.8 * sum(g.nodes[n]["saved_bytes"] for n in graph.nodes_of(layer))


@pytest.mark.slow
def test_saved_bytes_match_a_torch_compiled_block():
    """The rule against the real thing: a Llama block run under torch.compile (Inductor on CPU, ~25 s to
    compile) saves, for its backward, what the compiled graph predicts, within 1% (Inductor also keeps
    each norm's tiny rstd, which the rule drops); run eagerly it saves exactly the captured bytes."""
    import torch

    spec = resolve_model("llama:layers=2,hidden=256,heads=8,kv_heads=4,seq=256,vocab=512")
    graph = capture(spec, dtype="fp32")
    layer = split_model(graph)[1][1]
    predicted = {name: sum(gr.g.nodes[n]["saved_bytes"] for n in gr.nodes_of(layer))
                 for name, gr in (("eager", graph), ("compiled", compiled(graph)))}
    torch.manual_seed(0)
    model = spec.build()
    block, s = model.blocks[1], spec.seq_len
    cos, sin = model.rope_cos[:s], model.rope_sin[:s]
    skip = {t.untyped_storage().data_ptr() for t in (*block.parameters(), cos, sin)}

    def saved(fn) -> int:
        seen: dict[int, int] = {}

        def pack(t):
            st = t.untyped_storage()
            if st.data_ptr() not in skip:
                seen[st.data_ptr()] = st.nbytes()
            return t

        x = torch.randn(1, s, model.cfg.hidden, requires_grad=True)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = fn(x, cos, sin)
        y.sum().backward()
        return sum(seen.values())

    # the block's input stands in for its own output, which the next block saves (charged to this one)
    assert saved(block) == predicted["eager"]
    fn = torch.compile(block)
    saved(fn)  # compile
    measured = saved(fn)
    assert measured < 0.85 * predicted["eager"]
    assert measured == pytest.approx(predicted["compiled"], rel=0.01)


def test_a_compiled_plan_is_faster_says_so_and_the_runtime_takes_it():
    train = TrainConfig(global_batch=16, dtype="bf16")
    fixed = dict(tp=1, zero=3, recompute="none", micro_batch=2, offload=False)
    eager = plan(LLAMA, cluster="1x8xH100-80GB", train=train, **fixed)
    fast = plan(LLAMA, cluster="1x8xH100-80GB", train=train, kernels="compiled", **fixed)
    assert fast.predicted["step_time_s"] < eager.predicted["step_time_s"]
    assert fast.predicted["peak_memory_bytes"] < eager.predicted["peak_memory_bytes"]  # fewer saved tensors
    assert fast.kernels == "compiled" and eager.kernels == "eager"
    assert "kernels: compiled" in explain(fast, width=400)
    assert not any("kernels" in a for a in eager.predicted["assumptions"])
    spec = resolve_model(LLAMA)
    assert isinstance(preflight(fast, spec, 8), list)  # the runtime compiles its layers (tests/e2e)
    bad = Plan.from_dict({**fast.to_dict(), "solver": {**fast.solver, "fixed": {"kernels": "jit"}}})
    with pytest.raises(PlanError, match="kernels is 'jit'.*runs eager or compiled"):
        preflight(bad, spec, 8)
    d = fast.to_dict()
    layer = next(b for b in d["blocks"] if is_layer(b["fqn"]))
    layer.update(recompute="selective", offload_activations=True)
    with pytest.raises(PlanError, match=f"offloads what {layer['fqn']} keeps under selective .* --offload off"):
        preflight(Plan.from_dict(d), spec, 8)


def test_a_compiled_search_never_offloads_what_a_selective_checkpoint_keeps():
    """The runtime cannot compile a selective checkpoint that offloads (planner.plan.executable.offload_refusal),
    so the search leaves that variant out: eager, memory pressure makes the plan offload selectively kept
    activations; compiled, the plan does without, and the runtime takes it."""
    train, fixed = TrainConfig(global_batch=16, dtype="bf16"), dict(tp=1, recompute="selective")
    eager = plan("llama3-8b", cluster="1x8xA100-40GB", train=train, **fixed)
    assert any(b.offload_activations and b.recompute == "selective" for b in eager.blocks)
    fast = plan("llama3-8b", cluster="1x8xA100-40GB", train=train, kernels="compiled", **fixed)
    assert not any(b.offload_activations for b in fast.blocks)
    assert isinstance(preflight(fast, resolve_model("llama3-8b"), 8), list)
    with pytest.raises(PartitaError, match=r"compiled layers offload activations only with recompute none "
                                           r"\(--recompute none, or --kernels eager\)"):
        plan("llama3-8b", cluster="1x4xA100-40GB", train=train, kernels="compiled", **fixed)


def test_only_the_layers_are_compiled(graph):
    """The runtime compiles the layers (costmodel.price.fusion.is_layer, which runtime.parallel.blocks uses); the embedding
    and the head are priced eager, as they run."""
    layers = {g for g in graph.groups if is_layer(g)}
    assert layers == set(graph.repeated())  # a transformer's layers are its repeated groups
    assert all(graph.g.nodes[m[0]]["group"] in layers for m in fusion_groups(graph))
    cg = compiled(graph)
    for n in graph.g.nodes:
        if graph.g.nodes[n]["group"] not in layers:
            assert cg.g.nodes[n]["mem_bytes"] == graph.g.nodes[n]["mem_bytes"]


def test_a_numbered_block_that_is_not_repeated_is_priced_as_it_runs_compiled():
    """ResNet's first block of each stage differs from the rest (a downsampling projection), so it is not
    in OpGraph.repeated(); the runtime compiles every numbered block all the same, and the pricing follows
    the runtime's rule, not the repetition."""
    g = capture(resolve_model("tiny-resnet"))
    fused = {g.g.nodes[m[0]]["group"] for m in fusion_groups(g)}
    odd = [b for b in g.groups if is_layer(b) and b not in g.repeated()]
    assert odd and set(odd) <= fused and fused <= {b for b in g.groups if is_layer(b)}
    assert runtime_is_layer is is_layer


def test_baselines_are_priced_with_the_plans_kernels():
    train = TrainConfig(global_batch=16, dtype="bf16")
    step = {}
    for kernels in ("eager", "compiled"):
        p = plan(LLAMA, cluster="1x8xH100-80GB", train=train, baselines=True, kernels=kernels)
        step[kernels] = {b["name"]: b["predicted"]["step_time_s"] for b in p.baselines if b["fits"]}
    assert step["eager"].keys() == step["compiled"].keys() and "DDP" in step["eager"]
    assert all(step["compiled"][name] < step["eager"][name] for name in step["eager"])


def test_an_unknown_kernels_setting_is_one_line():
    with pytest.raises(PartitaError, match="^kernels must be one of eager, compiled, got 'jit'$"):
        SearchSpace(kernels="jit")


def test_a_torch_whose_policies_do_not_see_outputs_gets_no_selective_offload(monkeypatch):
    """Offloading what a selective or op checkpoint keeps needs SelectiveCheckpointContext.op_output (torch
    2.13 has it, 2.11 has not; a shipped plan doing it failed on a lent H200's torch 2.11). Under such a torch
    the search leaves those variants out and the pre-flight refuses a plan that has one, in one line."""
    from partita.planner.plan import executable
    train, fixed = TrainConfig(global_batch=16, dtype="bf16"), dict(tp=1, recompute="selective")
    eager = plan("llama3-8b", cluster="1x8xA100-40GB", train=train, **fixed)
    assert any(b.offload_activations and b.recompute == "selective" for b in eager.blocks)
    monkeypatch.setattr(executable, "checkpoint_policies_see_outputs", lambda: False)
    with pytest.raises(PlanError, match=r"offloads what selective recompute keeps, which needs a torch whose "
                                        r"checkpoint policies see op outputs; torch .* use recompute none"):
        preflight(eager, resolve_model("llama3-8b"), 8)
    old = plan("llama3-8b", cluster="1x8xA100-40GB", train=TrainConfig(global_batch=16, dtype="bf16"),
               tp=1, recompute=("none", "selective"))
    assert not any(b.offload_activations and b.recompute != "none" for b in old.blocks)
    assert isinstance(preflight(old, resolve_model("llama3-8b"), 8), list)
