"""Capture with torch.export, into the same OpGraph, with the same node attributes, as symbolic_trace.

HuggingFace models (and any module whose Python control flow reads shapes) do not trace with
torch.fx.symbolic_trace; torch.export (non-strict) runs their forward on fake tensors and records an
ATen-level fx graph whose nodes carry `nn_module_stack`. This module exports the model with its loss,
runs that graph with the shared `partita.costmodel.capture.trace.Recorder` (same FLOP, backward-FLOP and saved-tensor
accounting), and normalises what differs from a symbolic_trace graph:

- Parameters, buffers and constants are graph inputs in an export graph. The op of a leaf module with
  parameters (nn.Linear, nn.Embedding, nn.LayerNorm, nn.Conv2d, BatchNorm, ... and transformers'
  Conv1D) absorbs them and is recorded as op "call_module" with target = the module FQN and kind = its
  class name lowercased ("linear", "embedding", "layernorm", "conv2d"), as symbolic_trace records a leaf
  module; its `params` are the module's parameters under the user's names
  (`transformer.h.0.attn.c_attn.weight`) and its `mem_bytes` leave them out, as for a call_module node.
  State used by other ops (an RMSNorm weight, a rotary buffer) becomes a "get_attr" node placed just
  before its first user, as symbolic_trace would place it. A tied parameter is counted once, at its
  first use.
- Kinds are normalised to the vocabulary planner.enumerate.strategies reads: `aten.addmm` of a Conv1D is
  "linear"; `_softmax` -> "softmax"; `_unsafe_view`, `alias`, `unsqueeze`, `squeeze` -> "view" (size-
  agnostic views: no `infer_dim_at`); `t` -> "transpose"; `slice` (step 1) -> "narrow"; in-place `add_`
  -> "add"; `scaled_dot_product_attention`, `gelu`, `silu`, ... keep their names.
- `module` is the innermost `nn_module_stack` entry with the loss wrapper's prefix stripped.
- Linear nodes carry `weight_layout`: "out_in" for nn.Linear ([out, in], y = x W^T), "in_out" for
  transformers' Conv1D ([in, out], y = x W), so a runtime can shard the right dimension.
- Nodes without outputs (`_assert_tensor_metadata` and other checks) and the subgraphs of higher-order
  ops (a `torch.no_grad()` region becomes one `wrap_with_set_grad_enabled` node) are not nodes.
- A call_module node keeps its ATen op in `aten` ("aten.linear.default", "aten.addmm.default").
- Grouped GEMMs of mixture-of-experts layers (`_grouped_mm`, transformers' `grouped_mm_fallback`) are
  kind "grouped_mm" with `groups` = the number of experts (the weight's leading dimension).
"""
from __future__ import annotations

import contextlib
import io
import logging
import sys
import time

import torch
import torch.fx as fx
import torch.nn as nn
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
from torch.export.graph_signature import InputKind

from partita.costmodel.capture.graph import OpGraph
from partita.costmodel.models import ModelSpec
from partita.costmodel.capture.fake import build_fake, wrap_for_capture
from partita.costmodel.capture.failures import CaptureFailed
from partita.costmodel.capture.trace import Recorder, _dim_args, _storage_key, is_dtype_check

_LEAF_TYPES = (nn.Linear, nn.Embedding, nn.EmbeddingBag, nn.LayerNorm, nn.GroupNorm,
               nn.modules.batchnorm._NormBase, nn.modules.conv._ConvNd, *((nn.RMSNorm,) if hasattr(nn, "RMSNorm") else ()))

_KIND = {"_unsafe_view": "view", "alias": "view", "unsqueeze": "view", "squeeze": "view",
         "t": "transpose", "_softmax": "softmax", "_log_softmax": "log_softmax", "slice": "narrow",
         "split_with_sizes": "split", "_to_copy": "to", "native_dropout": "dropout",
         "layer_norm": "layernorm", "native_layer_norm": "layernorm", "true_divide": "div",
         "cross_entropy_loss": "cross_entropy", "_grouped_mm": "grouped_mm", "grouped_mm_fallback": "grouped_mm"}
_SIZE_AGNOSTIC_VIEWS = {"alias", "unsqueeze", "squeeze"}  # "view" kinds that fix no size: no infer_dim_at


def _tied_names(mod: nn.Module, path: str, taken: list[tuple]) -> dict[str, str]:
    """{this module's name for a parameter: the name it was captured under} for each parameter `mod` holds
    under another module's name (a tied weight: torch.export lifts it once, under its first name), as
    symbolic_trace captures record it (node attribute `tied`)."""
    local = {id(t): name for name, t in mod.named_parameters(recurse=False)}
    out = {}
    for target, t, is_param in taken:
        mine = f"{path}.{local[id(t)]}" if path and id(t) in local else None
        if is_param and mine is not None and mine != target:
            out[mine] = target
    return out


def _is_conv1d(m: nn.Module) -> bool:
    """transformers.pytorch_utils.Conv1D: a linear layer with its weight stored [in, out]."""
    return type(m).__name__ == "Conv1D" and type(m).__module__.startswith("transformers.")


def _is_leaf(m: nn.Module) -> bool:
    return isinstance(m, _LEAF_TYPES) or _is_conv1d(m)


def _aten_name(n: fx.Node) -> str:
    t = n.target
    packet = getattr(t, "_overloadpacket", None)
    if packet is not None:
        return packet.__name__
    return getattr(t, "__name__", None) or (t.name() if hasattr(t, "name") else str(t))


def _normalised_kind(n: fx.Node) -> tuple[str, str]:
    """(kind, name for _dim_args or "") of a call_function node that is not a leaf-module op."""
    raw = _aten_name(n)
    if raw == "slice" and len(n.args) > 4 and n.args[4] not in (None, 1):
        return "slice", ""
    name = _KIND.get(raw, raw)
    if name.endswith("_") and not name.startswith("_"):  # in-place add_, mul_, masked_fill_
        name = name[:-1]
    if raw in _SIZE_AGNOSTIC_VIEWS:
        return name, ""
    return name, name


def _export(root: nn.Module, args: tuple, mode: FakeTensorMode, strip: str, hf: bool):
    """torch.export (non-strict) on fake tensors; on failure, CaptureFailed naming the innermost module."""
    names = {m: name for name, m in root.named_modules()}
    stack: list[nn.Module] = []
    handles = []
    def enter(mod, a):
        stack.append(mod)

    def leave(mod, a, out):
        if stack:
            stack.pop()

    for m in names:
        handles.append(m.register_forward_pre_hook(enter))
        handles.append(m.register_forward_hook(leave))
    err = io.StringIO()  # a failed export prints its partial graph to stderr: the message below says enough
    try:
        with mode, contextlib.ExitStack() as ctx:
            if hf:
                ctx.enter_context(_hf_context(root))
            ctx.enter_context(_quiet_export_logs())
            ctx.enter_context(contextlib.redirect_stderr(err))
            ep = torch.export.export(root, args, strict=False)
        sys.stderr.write(err.getvalue())
        return ep
    except Exception as e:
        mod = cls = None
        if stack:
            name = names.get(stack[-1], "")
            mod = name[len(strip):] if strip and name.startswith(strip) else ("" if name == strip.rstrip(".") else name)
            cls = type(stack[-1]).__name__
        raise CaptureFailed("torch.export", mod, cls, e) from None
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def _quiet_export_logs():
    """A failed export also logs the partial graph as a warning; the CaptureFailed message says enough."""
    loggers = [logging.getLogger(n) for n in ("torch.fx.experimental.symbolic_shapes", "torch.export",
                                               "torch._export", "torch._dynamo")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _hf_context(root: nn.Module):
    from partita.costmodel.models.hf_export import export_context
    return export_context(root)


def _export_and_record(spec: ModelSpec, dtype: str, batch: int, autocast: str | None = None):
    """Export `spec`'s model (with its loss) built in `dtype` on fake tensors and run the graph with the
    shared Recorder (`autocast`: under bf16 autocast, costmodel.capture.autocast): (root, model, strip, gm, state,
    recorder)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model, inputs = build_fake(spec, dtype, mode, batch)
    with mode:
        root, args, strip, _ = wrap_for_capture(spec, model, inputs)
    root.train()
    from partita.costmodel.models.hf_export import contains_hf_model
    ep = _export(root, args, mode, strip, contains_hf_model(model))  # bare, or inside the user's wrapper
    gm = ep.graph_module

    # the export graph's inputs: model state (by the user's names) and the example batch ------------
    canonical: dict[int, str] = {}
    for name, p in model.named_parameters():
        canonical.setdefault(id(p), name)
    for name, b in model.named_buffers():
        canonical.setdefault(id(b), name)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    flat: list = []
    state: dict[str, tuple[str, torch.Tensor, bool]] = {}   # node -> (name, tensor, is parameter)
    user = iter(args)
    for node, ispec in zip(placeholders, ep.graph_signature.input_specs):
        if ispec.kind == InputKind.USER_INPUT:
            flat.append(next(user))
            continue
        if ispec.kind == InputKind.PARAMETER:
            t = root.get_parameter(ispec.target)
        elif ispec.kind == InputKind.BUFFER:
            t = root.get_buffer(ispec.target)
        elif ispec.kind == InputKind.CONSTANT_TENSOR:
            t = ep.constants[ispec.target]
        else:
            raise CaptureFailed("torch.export", None, None,
                                NotImplementedError(f"graph input of kind {ispec.kind.name} is not supported"))
        target = canonical.get(id(t))
        if target is None:
            target = ispec.target[len(strip):] if strip and ispec.target.startswith(strip) else ispec.target
        state[node.name] = (target, t, ispec.kind == InputKind.PARAMETER)
        flat.append(t)
    param_storages = {_storage_key(t) for _, t, _ in state.values()}
    rec = Recorder(gm, param_storages)
    try:
        rec.record(mode, *flat, autocast=autocast)
    except (DynamicOutputShapeException, DataDependentOutputException) as e:
        raise _data_dependent(gm, rec, root, strip, e) from e
    return root, model, strip, gm, state, rec


def _data_dependent(gm: fx.GraphModule, rec: Recorder, root: nn.Module, strip: str, e: Exception) -> CaptureFailed:
    """An op whose output's shape (or a value it returns) depends on tensor values, which fake tensors cannot
    know (BART's classification head counts <eos> tokens with torch.unique_consecutive): the capture's failure
    with the module it ran in, where capture_error words it in one line."""
    node = next((n for n in gm.graph.nodes if n.name == rec._current), None)
    path, mod = _owner_of(node, root, strip) if node is not None else ("", None)
    op = str(getattr(node, "target", "")) if node is not None else type(e).__name__
    return CaptureFailed("torch.export", path or None, type(mod).__name__ if mod is not None else None,
                         RuntimeError(f"{op} is data-dependent: its output depends on tensor values, which a "
                                      "capture on fake tensors cannot know"))


def _autocast_record(spec: ModelSpec, batch: int, autocast: str, names: list[str]) -> dict | None:
    """The memory attributes of the model exported in fp32 and run under autocast, for the bf16 export's
    nodes `names` (in graph order): by name, or where the model's code picks another kernel for another
    dtype (transformers' MoE layers: `_grouped_mm` in bf16, a fallback in fp32) position by position in
    a graph of as many nodes; None when neither pairs them."""
    *_, rec = _export_and_record(spec, "fp32", batch, autocast)
    attrs = rec.memory_attrs()
    if set(names) <= set(attrs):
        return attrs
    return dict(zip(names, attrs.values())) if len(attrs) == len(names) else None


def capture_export(spec: ModelSpec, dtype: str, batch: int, autocast: str | None = None) -> OpGraph:
    """Export `spec`'s model with its loss on fake tensors and record it into an OpGraph; `autocast`: also
    record it as the runtime's autocast runs it (costmodel.capture.trace, a second export of the fp32 model, as
    the model's code may read its parameters' dtype)."""
    t0 = time.perf_counter()
    root, model, strip, gm, state, rec = _export_and_record(spec, dtype, batch)
    memory = rec.memory_attrs()
    kept = [n.name for n in gm.graph.nodes if n.name in rec.stats and not is_dtype_check(n)]
    mixed = _autocast_record(spec, batch, autocast, kept) if autocast else None
    owners, absorbs = _absorbed_state(gm, root, strip, state)
    graph = OpGraph(name=spec.name, batch=batch, seq_len=spec.seq_len, dtype=dtype)
    writer = _GraphWriter(graph, rec, state, memory, mixed)
    for n in gm.graph.nodes:
        if n.op == "output" or n.name in state:
            continue
        st = rec.stats.get(n.name)
        if st is None:
            continue
        if n.op == "get_attr" or (n.op == "call_function" and not st["out_bytes"] and not n.users):
            continue  # HOP bodies (GraphModules), and checks without outputs
        writer.write(n, owners, absorbs)
    if mixed:
        graph.g.graph["autocast"] = autocast
    graph.finalize(capture_seconds=time.perf_counter() - t0)
    return graph


def _owner_of(n: fx.Node, root: nn.Module, strip: str) -> tuple[str, nn.Module | None]:
    """(module path with the loss wrapper's prefix stripped, the module) of the innermost module an op runs in."""
    stack = n.meta.get("nn_module_stack")
    if not stack:
        return "", None
    path = str(list(stack.values())[-1][0])
    try:
        mod = root.get_submodule(path)
    except AttributeError:
        mod = None
    if strip:
        path = path[len(strip):] if path.startswith(strip) else ("" if path == strip.rstrip(".") else path)
    return path, mod


def _absorbed_state(gm: fx.GraphModule, root: nn.Module, strip: str, state: dict) -> tuple[dict, dict]:
    """Which op of a leaf module absorbs its state: (op node -> (module path, module), op node -> the state
    nodes it absorbs, for the ops of a leaf module that read at least one of its parameters)."""
    absorbs: dict[str, list[str]] = {}     # op node -> state nodes it absorbs
    owners: dict[str, tuple[str, nn.Module | None]] = {}
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        owners[n.name] = path, mod = _owner_of(n, root, strip)
        if mod is None or not _is_leaf(mod):
            continue
        own = {id(t) for t in [*mod.parameters(recurse=False), *mod.buffers(recurse=False)]}
        taken = [a.name for a in n.all_input_nodes if a.name in state and id(state[a.name][1]) in own]
        if any(state[s][2] for s in taken):
            absorbs[n.name] = taken
    return owners, absorbs


class _GraphWriter:
    """Writes an export graph's recorded nodes into an OpGraph (module docstring): each parameter counted once,
    at its first use; a state node not absorbed by a leaf module's op written just before its first user."""

    def __init__(self, graph: OpGraph, rec, state: dict, memory: dict, mixed: dict | None):
        self.graph, self.rec, self.state, self.memory, self.mixed = graph, rec, state, memory, mixed
        self.param_bytes = {target: t.numel() * t.element_size() for target, t, is_param in state.values() if is_param}
        self.counted: set[int] = set()
        self.emitted: set[str] = set()

    def write(self, n: fx.Node, owners: dict, absorbs: dict) -> None:
        """Node n, after the state it reads and does not absorb, and its edges from what is written."""
        state, st = self.state, self.rec.stats[n.name]
        for a in n.all_input_nodes:
            if a.name in state and a.name not in self.emitted and a.name not in absorbs.get(n.name, ()):
                self.write_state(a.name)
        if n.op == "placeholder":
            self.add(n.name, op="placeholder", target=str(n.target), kind="placeholder", module="",
                     mem_bytes=st["mem_bytes"])
        elif n.name in absorbs:
            self.write_leaf_op(n, *owners[n.name], absorbs[n.name])
        else:
            kind, dim_name = _normalised_kind(n)
            dims = _dim_args(n, self.rec.stats, dim_name) if dim_name else {}
            if _aten_name(n) == "t":
                dims = {"dims": (0, 1)}
            if kind == "grouped_mm":  # one GEMM per expert: costmodel.price.kernels prices each on its rows
                weight = self.rec.stats.get(getattr(n.args[1], "name", ""), {}).get("shape", ())
                dims = {"groups": weight[0]} if len(weight) == 3 else {}
            self.add(n.name, op=n.op, target=str(n.target), kind=kind, module=owners.get(n.name, ("", None))[0],
                     mem_bytes=st["mem_bytes"], **dims)
        for a in n.all_input_nodes:
            if a.name in self.emitted:
                self.graph.add_edge(a.name, n.name, nbytes=self.rec.stats[a.name]["out_bytes"])

    def write_leaf_op(self, n: fx.Node, path: str, mod: nn.Module, taken: list[str]) -> None:
        """A leaf module's op that absorbs its state: a call_module node (module docstring)."""
        state, st = self.state, self.rec.stats[n.name]
        conv1d = _is_conv1d(mod)
        kind = "linear" if conv1d else type(mod).__name__.lower()
        own_bytes = sum(state[s][1].numel() * state[s][1].element_size() for s in taken)
        fp32_bytes = sum(state[s][1].numel() * (4 if state[s][1].is_floating_point() else state[s][1].element_size())
                         for s in taken)
        extra = {"weight_layout": "in_out" if conv1d else "out_in"} if kind == "linear" else {}
        tied = _tied_names(mod, path, [state[s] for s in taken])
        self.add(n.name, (own_bytes, fp32_bytes), op="call_module", target=path, kind=kind, module=path,
                 mem_bytes=0 if st["alias"] else max(0, st["mem_bytes"] - own_bytes),
                 params=self.take_params(taken), aten=str(n.target), **extra, **({"tied": tied} if tied else {}))

    def write_state(self, s: str) -> None:
        """A parameter or buffer read by an op that does not absorb it: a get_attr node."""
        target, t, is_param = self.state[s]
        st = self.rec.stats[s]
        self.add(s, op="get_attr", target=target, kind="get_attr", module=target.rpartition(".")[0],
                 mem_bytes=st["mem_bytes"], params=self.take_params([s]) if is_param else {})

    def take_params(self, names: list[str]) -> dict[str, int]:
        """{name: numel} of the parameters among the state nodes `names` not counted yet (a tied one counts once)."""
        out = {}
        for s in names:
            target, t, is_param = self.state[s]
            if is_param and id(t) not in self.counted:
                self.counted.add(id(t))
                out[target] = t.numel()
        return out

    def add(self, name: str, absorbed: tuple[int, int] = (0, 0), **attrs) -> None:
        """`absorbed`: bytes of the state the node absorbs (a leaf module's op), in the capture's dtype and
        in fp32, which its mem_bytes leave out (module docstring)."""
        st = self.rec.stats[name]
        params = attrs.pop("params", {})
        own = {k: v for k, v in self.memory[name].items() if k != "mem_bytes"}  # mem_bytes: the caller's
        if self.mixed:
            m = self.mixed[name]
            own["autocast"] = {**m, "mem_bytes": 0 if st["alias"] else max(0, m["mem_bytes"] - absorbed[1])}
        self.graph.add_node(name, shape=st["shape"], dtype=st["dtype"], **own,
                            fwd_flops=st["fwd_flops"], bwd_flops=st["bwd_flops"], alias=st["alias"],
                            params=params, param_bytes=sum(self.param_bytes[p] for p in params),
                            **({"uncosted": st["uncosted"]} if st["uncosted"] else {}), **attrs)
        self.emitted.add(name)

