"""Capture a model into an OpGraph on fake tensors.

`capture(spec)` builds the model under FakeTensorMode (no parameter memory, so a 1T-parameter model
captures on a laptop), traces it with torch.fx.symbolic_trace together with its loss, and runs the graph
once node by node on fake inputs of one sample. For every node it records:

- shapes and bytes of its output,
- forward FLOPs (FlopCounterMode, with the CPU attention formula registered) and backward FLOPs,
- the activation bytes autograd saves for the backward pass, observed with saved_tensors_hooks and
  attributed to the node that *produced* the saved storage (each storage counted once; parameters
  excluded) -- so a saved tensor is charged where it lives, which is what a sharding choice changes,
- the parameters it owns, and the module path (FQN) it belongs to.

Every per-sample quantity is linear in the micro-batch size, so one sample is traced and the planner
scales. The loss (cross-entropy over the logits) is part of the graph: its saved log-softmax is often the
largest activation of a language model.
"""
from __future__ import annotations

import time

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from costmodel.errors import PartitaError
from costmodel.flops import backward_flops, register_missing_formulas
from costmodel.graph import OpGraph
from costmodel.models import ModelSpec

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
_WRAP = "model."


class _WithLoss(nn.Module):
    """model + token cross-entropy, so the loss's saved tensors and FLOPs are captured too."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, tokens, targets):
        logits = self.model(tokens)
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class _Recorder(fx.Interpreter):
    def __init__(self, gm: fx.GraphModule, param_storages: set[int]):
        super().__init__(gm)
        self.param_storages = param_storages
        self.producer: dict[int, str] = {}
        self.keep: list = []  # keeps storages alive so their ids are never reused
        self.saved: dict[int, tuple[str, int]] = {}
        self.stats: dict[str, dict] = {}
        self._current = ""

    def pack(self, t: torch.Tensor):
        key = _storage_key(t)
        if key not in self.param_storages and key not in self.saved:
            self.saved[key] = (self.producer.get(key, self._current), t.untyped_storage().nbytes())
            self.keep.append(t)
        return t

    def run_node(self, n: fx.Node):
        self._current = n.name
        in_keys = {_storage_key(a) for a in n.all_input_nodes for a in [self.env[a]] if isinstance(a, torch.Tensor)}
        with FlopCounterMode(display=False) as counter:
            out = super().run_node(n)
        counts = counter.get_flop_counts().get("Global", {})
        tensors = [t for t in (out if isinstance(out, (tuple, list)) else [out]) if isinstance(t, torch.Tensor)]
        alias = bool(tensors) and all(_storage_key(t) in in_keys for t in tensors)
        for t in tensors:
            self.producer.setdefault(_storage_key(t), n.name)
            self.keep.append(t)
        in_bytes = sum(a.numel() * a.element_size() for a in (self.env[x] for x in n.all_input_nodes)
                       if isinstance(a, torch.Tensor))
        out_bytes = sum(t.numel() * t.element_size() for t in tensors)
        self.stats[n.name] = {
            "shape": tuple(tensors[0].shape) if tensors else (),
            "dtype": str(tensors[0].dtype).replace("torch.", "") if tensors else "",
            "out_bytes": out_bytes,
            "fwd_flops": int(sum(counts.values())),
            "bwd_flops": int(backward_flops(counts)),
            "alias": alias,
            "mem_bytes": 0 if alias else in_bytes + out_bytes,
        }
        return out


def _owner(n: fx.Node, gm: fx.GraphModule) -> str:
    if n.op == "call_module":
        return str(n.target)
    if n.op == "get_attr":
        return str(n.target).rpartition(".")[0]
    stack = n.meta.get("nn_module_stack")
    if stack:
        return str(list(stack.keys())[-1])
    return ""


def _kind(n: fx.Node, gm: fx.GraphModule) -> str:
    if n.op == "call_module":
        return type(gm.get_submodule(n.target)).__name__.lower()
    if n.op in ("call_function", "call_method"):
        return getattr(n.target, "__name__", str(n.target))
    return n.op


def capture(spec: ModelSpec, dtype: str = "fp32", batch: int = 1) -> OpGraph:
    """Trace `spec`'s model with its loss on fake tensors into an OpGraph (per-sample costs when batch=1)."""
    if dtype not in DTYPES:
        raise PartitaError(f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
    register_missing_formulas()
    t0 = time.perf_counter()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(DTYPES[dtype])  # build in the training dtype: Module.to() cannot swap fake params
    try:
        with mode:
            model = spec.build()
    finally:
        torch.set_default_dtype(previous)
    with mode:
        wrapped = _WithLoss(model)
        inputs = spec.example_inputs(batch)
        targets = torch.zeros(inputs[0].shape, dtype=torch.long) if spec.vocab else None
    try:
        gm = fx.symbolic_trace(wrapped) if targets is not None else fx.symbolic_trace(model)
    except Exception as e:  # torch.fx raises many types; name the model and the cause
        raise PartitaError(f"cannot capture {spec.name!r} with torch.fx.symbolic_trace: {type(e).__name__}: "
                           f"{str(e).splitlines()[0] if str(e) else ''}. Make data-dependent control flow "
                           "static, or give the model as a preset") from None
    params = dict(gm.named_parameters())
    # parameters and buffers are model state, not activations: saving them costs nothing extra
    param_storages = {_storage_key(t) for t in [*params.values(), *gm.buffers()]}
    rec = _Recorder(gm, param_storages)
    args = (*inputs, targets) if targets is not None else inputs
    with mode, torch.autograd.graph.saved_tensors_hooks(rec.pack, lambda t: t):
        loss = rec.run(*args)
    saved_by_node: dict[str, int] = {}
    for producer, nbytes in rec.saved.values():
        saved_by_node[producer] = saved_by_node.get(producer, 0) + nbytes
    strip = _WRAP if targets is not None else ""
    graph = OpGraph(name=spec.name, batch=batch, seq_len=spec.seq_len, dtype=dtype)
    owned = _params_by_node(gm)
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        st = rec.stats.get(n.name, {})
        owner = _owner(n, gm)
        owner = owner[len(strip):] if owner.startswith(strip) else ("" if owner == strip.rstrip(".") else owner)
        pnames = owned.get(n.name, [])
        graph.add_node(
            n.name, op=n.op, target=str(n.target), kind=_kind(n, gm), module=owner,
            shape=st.get("shape", ()), dtype=st.get("dtype", ""), out_bytes=st.get("out_bytes", 0),
            fwd_flops=st.get("fwd_flops", 0), bwd_flops=st.get("bwd_flops", 0),
            saved_bytes=saved_by_node.get(n.name, 0), alias=st.get("alias", False),
            mem_bytes=st.get("mem_bytes", 0),
            params={p[len(strip):]: params[p].numel() for p in pnames},
            **_dim_args(n, rec.stats),
            param_bytes=sum(params[p].numel() * params[p].element_size() for p in pnames),
        )
        for a in n.all_input_nodes:
            graph.add_edge(a.name, n.name, nbytes=rec.stats.get(a.name, {}).get("out_bytes", 0))
    graph.finalize(capture_seconds=time.perf_counter() - t0)
    return graph


def _params_by_node(gm: fx.GraphModule) -> dict[str, list[str]]:
    """Parameters owned by each node: a call_module's direct parameters, or a get_attr's parameter."""
    owned: dict[str, list[str]] = {}
    pnames = {name for name, _ in gm.named_parameters()}
    for n in gm.graph.nodes:
        if n.op == "call_module":
            mod = gm.get_submodule(n.target)
            owned[n.name] = [f"{n.target}.{p}" for p, _ in mod.named_parameters(recurse=True)]
        elif n.op == "get_attr" and str(n.target) in pnames:
            owned[n.name] = [str(n.target)]
    return owned


def _dim_args(n: fx.Node, stats: dict) -> dict:
    """The dims an op works along, normalised, for sharding propagation (planner.strategies)."""
    name = getattr(n.target, "__name__", str(n.target))
    first = n.args[0] if n.args else None
    rank = len(stats.get(first.name, {}).get("shape", ())) if isinstance(first, fx.Node) else 0
    if isinstance(first, (list, tuple)) and first and isinstance(first[0], fx.Node):  # cat([a, b], dim)
        rank = len(stats.get(first[0].name, {}).get("shape", ()))
    norm = (lambda i: i % rank if rank else i)
    out: dict = {}
    if name == "transpose" and len(n.args) >= 3:
        out["dims"] = (norm(n.args[1]), norm(n.args[2]))
    elif name == "permute":
        perm = n.args[1] if len(n.args) == 2 and isinstance(n.args[1], (list, tuple)) else n.args[1:]
        out["perm"] = tuple(norm(i) for i in perm)
    elif name in ("view", "reshape"):
        sizes = n.args[1] if len(n.args) == 2 and isinstance(n.args[1], (list, tuple)) else n.args[1:]
        out["infer_dim_at"] = next((i for i, v in enumerate(sizes) if isinstance(v, int) and v == -1), -1)
    elif name in ("softmax", "log_softmax", "cat", "chunk", "split", "narrow", "mean", "sum"):
        dim = n.kwargs.get("dim")
        if dim is None:
            pos = {"chunk": 2, "split": 2, "narrow": 1, "cat": 1}.get(name, 1)
            dim = n.args[pos] if len(n.args) > pos else 0
        if isinstance(dim, int):
            out["reduce_dim"] = norm(dim)
    return out
