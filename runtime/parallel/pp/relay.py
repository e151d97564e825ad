"""Values a model computes once and hands to every layer, relayed stage by stage through a pipeline.

HuggingFace decoders compute some tensors once, before their first layer, and pass them to every layer:
the rotary cos/sin tables (Llama, Mistral, Qwen2, Gemma, Phi-3 ...), a materialised causal mask (Falcon),
ALiBi biases. Split into pipeline stages, such a value flows from stage 0 straight to stages 2, 3, ...:
a skip connection, which torch.distributed.pipelining's schedules do not run ("Backward of skip
connections not supported yet"; "only supports adjacent-stage communication").

`relay_skips` rewrites the traced graph before it is split (the `split_policy` hook of
`torch.distributed.pipelining.pipeline`): a value made in stage s and used in stage t > s + 1 is passed on
by each stage in between -- an `aten.alias` of it at the start of stages s+1 .. t-1 -- and each later use
reads the copy of the stage just before it. Every stage then talks only to its neighbours. The relayed
values are small beside the hidden states (cos/sin: seq x head_dim; a mask: seq x seq per sample), they
need no gradient when they come from buffers and shapes, and where one does need a gradient the alias
passes it back unchanged. The numerics are those of the unsplit model: the same values reach every layer.

`skip_edges` names any stage input that still does not come from the stage before (a defensive check after
the split: a PlanError, one line, instead of torch's error at the first step).
"""
from __future__ import annotations

import contextlib

import torch
import torch.fx as fx


def _split_op():
    """The marker `pipe_split()` leaves in an exported graph (registered by torch.distributed.pipelining._IR,
    imported by a rank that runs a pipeline only: runtime.parallel.pp)."""
    from torch.distributed import pipelining  # noqa: F401 -- registers torch.ops.pippy
    return torch.ops.pippy._pipe_split.default


@contextlib.contextmanager
def split_markers(model: torch.nn.Module, fqns: list[str]):
    """While tracing: a pipe_split() marker at the start of each module `fqns` (SplitPoint.BEGINNING, set
    here so that `pipeline()` can take a split_policy, which it refuses beside a split_spec)."""
    from torch.distributed.pipelining import pipe_split
    saved = []
    for fqn in fqns:
        module = model.get_submodule(fqn)
        saved.append((module, vars(module).get("forward")))
        inner = module.forward

        def forward(*args, _inner=inner, **kwargs):
            pipe_split()
            return _inner(*args, **kwargs)

        module.forward = forward
    try:
        yield
    finally:
        for module, own in reversed(saved):
            if own is None:
                del module.forward
            else:
                module.forward = own


def _stages(graph: fx.Graph) -> tuple[dict[fx.Node, int], list[fx.Node]]:
    """Each node's stage (the number of markers before it) and the markers in order."""
    stage, of, markers, split = 0, {}, [], _split_op()
    for node in graph.nodes:
        if node.op == "call_function" and node.target is split:
            stage += 1
            markers.append(node)
        of[node] = stage
    return of, markers


def relay_skips(gm: fx.GraphModule) -> fx.GraphModule:
    """The split_policy (module docstring): relay every value used more than one stage after its own."""
    graph = gm.graph
    of, markers = _stages(graph)
    split = _split_op()
    for node in list(graph.nodes):
        if node.op in ("get_attr", "output") or node.target is split:
            continue  # parameters and buffers are copied into the stages that use them (pipeline's REPLICATE)
        users = [u for u in node.users if of[u] > of[node] + 1 and u.op != "output"]
        if not users or not isinstance(node.meta.get("val"), torch.Tensor):
            continue
        last, relays = max(of[u] for u in users), {of[node]: node}
        for k in range(of[node] + 1, last):
            with graph.inserting_after(markers[k - 1]):
                relay = graph.call_function(torch.ops.aten.alias.default, (relays[k - 1],))
            relay.meta = {key: v for key, v in node.meta.items() if key != "nn_module_stack"}
            relay.meta["nn_module_stack"] = _outside(markers[k - 1])
            of[relay] = k
            relays[k] = relay
        for user in users:
            user.replace_input_with(node, relays[of[user] - 1])
    graph.lint()
    gm.recompile()
    return gm


def _outside(marker: fx.Node) -> dict:
    """The module stack of the split module's caller: the marker's own stack without its innermost entry
    (the module the stage begins with), so a relay is not outlined into that module."""
    stack = list((marker.meta.get("nn_module_stack") or {}).items())
    return dict(stack[:-1])


def skip_edges(split_gm: fx.GraphModule) -> list[tuple[int, int]]:
    """(from stage, to stage) of every stage input that comes from a stage other than the one before it."""
    index = {}
    for node in split_gm.graph.nodes:
        if node.op == "call_module":
            index[node] = len(index)
    found = []
    for node, i in index.items():
        for arg in node.all_input_nodes:
            src = arg.args[0] if arg.op == "call_function" and arg.all_input_nodes else arg
            j = index.get(src)
            if j is not None and j != i - 1:
                found.append((j, i))
            elif j is None and src.op == "placeholder" and i > 0:
                found.append((0, i))
    return found
