"""Capture a model into an OpGraph on fake tensors.

`capture(spec)` builds the model under FakeTensorMode (no parameter memory, so a 1T-parameter model
captures on a laptop), traces it together with its loss, and runs the graph once node by node on fake
inputs of one sample. Two front ends give the fx graph:

- torch.fx.symbolic_trace (here): our own presets, CNNs, most plain modules;
- torch.export (costmodel.capture.export): HuggingFace models and anything with Python control flow on
  shapes, which symbolic_trace cannot follow.

`spec.capture` picks one ("fx", "export") or tries symbolic_trace first and torch.export second ("auto").
Both run the same `Recorder` over their graph, so both graphs carry the same node attributes. For every
node it records:

- shapes and bytes of its output,
- forward FLOPs (FlopCounterMode, with the CPU attention formula registered),
- backward FLOPs implied by each counted forward op and which of its operands require grad (a matmul
  or convolution costs one forward-sized product per operand needing a gradient; see `_FlopCounter`), so
  gradients a real run does not compute (the image fed to a first convolution, no-grad regions) cost
  nothing,
- the activation bytes autograd saves for the backward pass, observed with saved_tensors_hooks and
  attributed to the node that *produced* the saved storage (each storage counted once; parameters
  excluded) -- so a saved tensor is charged where it lives, which is what a sharding choice changes.
  Two kinds are told apart: `weight_saved_bytes`, saved tensors computed from parameters alone (a
  cast of a weight), which do not grow with the batch; and `cast_saved_bytes`, the part of a node's
  `saved_bytes` that is a cast of its input the node makes inside itself (autocast's), which a
  selective checkpoint re-runs rather than keeps (runtime/parallel/recompute.py),
- the parameters it owns, and the module path (FQN) it belongs to.

Mixed precision as the runtime runs it. A 16-bit capture records the model with 16-bit parameters:
what FSDP2's MixedPrecisionPolicy computes on (its gathered bf16 parameters), and Megatron-LM's bf16
model. partita's runtime trains a bf16 plan without FSDP under `torch.autocast` over the fp32 parameters
(runtime/parallel/precision.py), and that saves other tensors: the residual stream, norms and everything autocast
leaves alone stay fp32; each matmul saves a bf16 cast of its fp32 input (q, k and v three casts of one
norm output) and a bf16 cast of its weight (autocast caches one per weight and forward). So a 16-bit
capture records the model a second time the way autocast runs it -- fp32 parameters and buffers, under
`torch.autocast("cpu", bfloat16)` -- and keeps that record's bytes on every node as `autocast` (out_bytes,
mem_bytes, saved_bytes, weight_saved_bytes, cast_saved_bytes); `OpGraph.as_run("autocast")` is the graph
with them in place. CPU autocast casts the same operators CUDA's does to bf16 (matmuls, linear,
attention); CUDA runs some more in fp32 (softmax, log_softmax, pow, rsqrt, layer_norm, sum, exp) that
CPU runs in the input's dtype. On the inputs of the GPT and Llama models here (fp32 residuals, the fp32
logits of the loss) those see fp32 either way; a bf16 tensor reaching one of them (a materialised
attention's softmax) is recorded bf16 where CUDA would save fp32.

Every per-sample quantity is linear in the micro-batch size, so one sample is traced and the planner
scales. The loss is part of the graph (cross-entropy over the logits for our presets, `spec.loss_fn`
otherwise): its saved log-softmax is often the largest activation of a language model.
"""
from __future__ import annotations

import contextlib
import time

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils.flop_counter import FlopCounterMode

from partita.costmodel.capture.autocast import POLICIES, as_dtype, autocast_region, saved_kind, state_in
from partita.costmodel.errors import PartitaError
from partita.costmodel.price.flops import PRODUCT_OPERANDS, backward_flops, is_uncosted
from partita.costmodel.capture.graph import OpGraph
from partita.costmodel.models import ModelSpec
from partita.costmodel.capture.replicate import SHALLOW, pair_nodes
from partita.costmodel.capture.fake import build_fake, wrap_for_capture
from partita.costmodel.capture.failures import CaptureFailed


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _tensors(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for t in out if isinstance(t, torch.Tensor)]
    # a dict, or a pytree node (TorchRec's KeyedJaggedTensor and KeyedTensor register as ones)
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


class _FlopCounter(FlopCounterMode):
    """FlopCounterMode that also sums the backward FLOPs each counted forward op implies.

    The backward of a matmul or convolution computes one product of the forward's size per operand that
    requires grad (grad input, grad weight): the image fed to a first convolution, or a frozen weight,
    needs none. Ops run with grad disabled have no backward. Fused attention recomputes the scores:
    2.5x its forward (costmodel.price.flops). Other counted ops: 2x. Ops with FLOPs it cannot count
    (`partita.costmodel.price.flops.is_uncosted`) are named in `uncosted`.
    """

    def __init__(self, node_op=None, node_grads: tuple[bool, ...] = ()):
        super().__init__(display=False)
        self.bwd_flops = 0
        self.uncosted: set[str] = set()
        # An export graph's node is one op. A custom op with its own autograd formula (transformers'
        # grouped_mm_fallback) runs its forward with grad disabled and detached operands, so which operands
        # need gradients is read from the node's inputs, outside the op.
        self.node_op, self.node_grads = node_op, node_grads

    def _count_flops(self, func_packet, out, args, kwargs):
        result = super()._count_flops(func_packet, out, args, kwargs)
        if func_packet not in self.flop_registry and is_uncosted(func_packet, out):
            self.uncosted.add(str(func_packet))
        outer = func_packet is self.node_op
        if func_packet in self.flop_registry and (torch.is_grad_enabled() or outer):
            def needs(i: int) -> bool:
                return (self.node_grads[i] if i < len(self.node_grads) else False) if outer else (
                    i < len(args) and _needs_grad(args[i]))
            name = func_packet.__name__
            fwd = self.flop_registry[func_packet](*args, **kwargs, out_val=out)
            if name in PRODUCT_OPERANDS:
                self.bwd_flops += int(fwd) * sum(1 for i in PRODUCT_OPERANDS[name] if needs(i))
            elif any(needs(i) for i in range(len(args))):
                self.bwd_flops += int(backward_flops({func_packet: fwd}))
        return result


def _needs_grad(a) -> bool:
    return isinstance(a, torch.Tensor) and a.requires_grad


RNG_STATE_BYTES = 16
"""What fused attention with dropout keeps to redraw its dropout mask in the backward: the generator's seed
and offset, two int64 (FlashAttention-2's `rng_state`, the philox seed and offset of PyTorch's flash,
memory-efficient and cuDNN kernels)."""

_DROPOUT_AT = 4
"""Position of dropout_p in F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, ...)."""


def fused_attention_call(target, args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
    """(args, kwargs, draws dropout) of a call, with the dropout of a scaled_dot_product_attention set to 0.

    On a GPU, SDPA with dropout_p > 0 runs a fused kernel (flash, memory-efficient or cuDNN attention all
    take dropout): it keeps q, k, v, its output, the log-sum-exp and the generator state, and redraws the
    mask inside its backward -- no s x s tensor is ever stored. The capture runs on CPU, where SDPA with
    dropout falls back to math attention, which materialises and saves the scores, the probabilities
    and the mask (O(s^2) bytes: a 125M GPT at micro-batch 32 priced at 245 GiB). So the capture runs
    the call without dropout -- the same fused kernel, the same FLOPs and saved tensors -- and the caller
    charges RNG_STATE_BYTES for the generator state. Any other call is returned unchanged."""
    packet = getattr(target, "overloadpacket", None)
    name = packet.__name__ if packet is not None else getattr(target, "__name__", "")
    if target is not F.scaled_dot_product_attention and name != "scaled_dot_product_attention":
        return args, kwargs, False
    schema = getattr(target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    at = names.index("dropout_p") if "dropout_p" in names else _DROPOUT_AT
    p = kwargs.get("dropout_p", args[at] if len(args) > at else 0.0)
    if not p:
        return args, kwargs, False
    if "dropout_p" in kwargs:
        return args, {**kwargs, "dropout_p": 0.0}, True
    return (*args[:at], 0.0, *args[at + 1:]), kwargs, True


def is_dtype_check(n: fx.Node) -> bool:
    """An export graph's assertion of a tensor's traced dtype and device (no output, no cost)."""
    return getattr(n.target, "__name__", "").startswith("_assert_tensor_metadata")


class Recorder(fx.Interpreter):
    """Runs a graph node by node on fake tensors, recording per-node costs (see the module docstring).

    Shared by both captures: `record()` runs the forward under saved_tensors_hooks and leaves per-node
    `stats` and, through `saved_by_node()`, the saved-activation bytes each node produced.
    """

    def __init__(self, gm: fx.GraphModule, param_storages: set[int]):
        super().__init__(gm)
        self.param_storages = param_storages
        self.producer: dict[int, str] = {}
        self.keep: list = []  # keeps storages alive so their ids are never reused
        self.saved: dict[int, tuple[str, int, str]] = {}
        """storage -> (node charged, bytes, kind: "" activation, "cast" an internal input cast, "weight")"""
        self.stats: dict[str, dict] = {}
        self._current = ""
        self._in_dropout = False
        self._autocast = False

    def pack(self, t: torch.Tensor):
        key = _storage_key(t)
        if key not in self.param_storages and key not in self.saved:
            nbytes = t.untyped_storage().nbytes()
            internal = key not in self.producer
            if self._in_dropout and internal:
                # a dropout mask: CUDA's native_dropout keeps it as bool (1 byte an element, as in
                # Korthikanti et al.'s table); CPU PyTorch keeps it in the activation dtype. We plan for
                # accelerators, so charge the bool.
                nbytes = t.numel()
            kind = saved_kind(t)
            if kind == "cast" and not internal:
                kind = ""  # a node's own output (a `.float()` node): an activation like any other
            self.saved[key] = (self.producer.get(key, self._current), nbytes, kind)
            self.keep.append(t)
        return t

    def call_function(self, target, args, kwargs):
        """Run one call_function node; scaled_dot_product_attention with dropout as its fused kernel
        (`fused_attention_call`), charging the generator state it keeps."""
        args, kwargs, dropout = fused_attention_call(target, args, kwargs)
        out = super().call_function(target, args, kwargs)
        if dropout:
            self.saved[("rng_state", self._current)] = (self._current, RNG_STATE_BYTES, "")
        return out

    def run_node(self, n: fx.Node):
        if self._autocast and is_dtype_check(n):
            return None  # an export graph's check of the dtype it was traced with, which autocast changes
        self._current = n.name
        self._in_dropout = "dropout" in str(getattr(n.target, "__name__", n.target)).lower() or (
            n.op == "call_module" and "dropout" in type(self.module.get_submodule(n.target)).__name__.lower())
        # (a tuple input counts too: `getitem` of a `chunk`/`split` result is a view of the chunked tensor)
        in_keys = {_storage_key(t) for a in n.all_input_nodes for t in _tensors(self.env[a])}
        node_op, node_grads = None, ()
        target = getattr(n.target, "custom_op", n.target)  # a wrapped function running one op (gpt.grouped_mm)
        if n.op == "call_function" and isinstance(target, torch._ops.OpOverload) and torch.is_grad_enabled():
            node_op = target.overloadpacket
            node_grads = tuple(isinstance(a, fx.Node) and _needs_grad(self.env.get(a)) for a in n.args)
        with _FlopCounter(node_op, node_grads) as counter:
            out = super().run_node(n)
        counts = counter.get_flop_counts().get("Global", {})
        tensors = _tensors(out)
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
            "bwd_flops": counter.bwd_flops,
            "alias": alias,
            # a view moves no bytes, and neither does a node without a tensor output (x.size(), shape
            # arithmetic): no kernel runs
            "mem_bytes": 0 if alias or not tensors else in_bytes + out_bytes,
            "uncosted": tuple(sorted(counter.uncosted)),
        }
        return out

    def record(self, mode: FakeTensorMode, *args, autocast: str | None = None) -> None:
        """Run the forward on fake tensors under saved-tensor hooks, filling `stats` and `saved`;
        `autocast`: under bf16 autocast following that device's lists (costmodel.capture.autocast)."""
        region = autocast_region(autocast) if autocast else contextlib.nullcontext()
        self._autocast = bool(autocast)
        with mode, region, torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t):
            self.run(*args)

    def saved_by_node(self, kinds: tuple[str, ...] = ("", "cast")) -> dict[str, int]:
        """Saved bytes charged to each node, of the given kinds (Recorder.saved): by default the
        activations, which grow with the batch; ("weight",) the weight copies, which do not."""
        out: dict[str, int] = {}
        for producer, nbytes, kind in self.saved.values():
            if kind in kinds:
                out[producer] = out.get(producer, 0) + nbytes
        return out

    def memory_attrs(self) -> dict[str, dict]:
        """Per node, the byte attributes a memory model reads (costmodel.capture.trace module docstring)."""
        saved, casts, weights = self.saved_by_node(), self.saved_by_node(("cast",)), self.saved_by_node(("weight",))
        return {n: {"out_bytes": st["out_bytes"], "mem_bytes": st["mem_bytes"], "saved_bytes": saved.get(n, 0),
                    "cast_saved_bytes": casts.get(n, 0), "weight_saved_bytes": weights.get(n, 0)}
                for n, st in self.stats.items()}


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


class _Tracer(fx.Tracer):
    """symbolic_trace's tracer, remembering which module was being traced when tracing failed.

    A parameter read in a forward (`x * self.weight`) becomes a get_attr node named as the root's
    named_parameters() names it; fx.Tracer finds that name by walking every parameter on every read
    (seconds for a 126-layer model), so the names are indexed once here."""

    def getattr(self, attr, attr_val, parameter_proxy_cache):
        if isinstance(attr_val, torch.nn.Parameter):
            names = self.__dict__.get("_param_names")
            if names is None:
                names = self._param_names = {}
                for n, p in self.root.named_parameters():
                    names.setdefault(id(p), n)
            name = names.get(id(attr_val))
            if name is not None:
                if name not in parameter_proxy_cache:
                    parameter_proxy_cache[name] = self.create_proxy("get_attr", name, (), {})
                return parameter_proxy_cache[name]
        return super().getattr(attr, attr_val, parameter_proxy_cache)

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        """torch.nn's modules, and partita's stand-ins marked `fx_leaf` (costmodel.sparse.kjt)."""
        return getattr(m, "fx_leaf", False) or super().is_leaf_module(m, qualname)

    def call_module(self, m, forward, args, kwargs):
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception as e:
            if not hasattr(e, "_partita_module"):
                try:
                    e._partita_module = (self.path_of_module(m), type(m).__name__)
                except NameError:
                    pass
            raise


def _trace_fx(spec: ModelSpec, dtype: str, batch: int):
    """spec's model (with its loss) built on fake tensors and symbolically traced: (gm, mode, args, strip)."""
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model, inputs = build_fake(spec, dtype, mode, batch)
    with mode:
        root, args, strip, concrete = wrap_for_capture(spec, model, inputs)
    try:
        tracer = _Tracer()
        graph_ = tracer.trace(root, concrete_args=concrete)
        gm = fx.GraphModule(tracer.root, graph_, root.__class__.__name__)
    except Exception as e:  # torch.fx raises many types; name the module and the cause
        mod, cls = getattr(e, "_partita_module", (None, None))
        if mod is not None and strip:
            mod = mod[len(strip):] if mod.startswith(strip) else ("" if mod == strip.rstrip(".") else mod)
        raise CaptureFailed("torch.fx.symbolic_trace", mod, cls, e) from None
    return gm, mode, args, strip


def _record(gm: fx.GraphModule, mode: FakeTensorMode, args: tuple, autocast: str | None = None) -> Recorder:
    """Run `gm` node by node on fake tensors (`autocast`: with fp32 state and inputs, under bf16 autocast
    following that device's lists); the Recorder holds the per-node stats and saved bytes."""
    with state_in(gm, torch.float32, mode) if autocast else contextlib.nullcontext():
        if autocast:
            args = tuple(as_dtype(a, torch.float32, mode) for a in args)
        # parameters and buffers are model state, not activations: saving them costs nothing extra
        param_storages = {_storage_key(t) for t in [*gm.parameters(), *gm.buffers()]}
        rec = Recorder(gm, param_storages)
        rec.record(mode, *args, autocast=autocast)
    return rec


def _records(gm: fx.GraphModule, mode: FakeTensorMode, args: tuple, autocast: str | None):
    """(per-node stats, per-node memory attributes, the same under autocast or None)."""
    rec = _record(gm, mode, args)
    mixed = _record(gm, mode, args, autocast).memory_attrs() if autocast else None
    return rec.stats, rec.memory_attrs(), mixed


def _record_from_shallow(spec: ModelSpec, gm: fx.GraphModule, dtype: str, batch: int, autocast: str | None):
    """The deep graph's records (`_records`) copied from the same model built with replicate.SHALLOW layers
    (costmodel.capture.replicate), or None when the model has no shallow form or the graphs do not pair."""
    if spec.at_depth is None or not spec.layer_prefix:
        return None
    shallow_gm, mode, args, _ = _trace_fx(spec.at_depth(SHALLOW), dtype, batch)
    pairs = pair_nodes(gm, shallow_gm, spec.layer_prefix, _owner)
    if pairs is None:
        return None
    pick = lambda per: None if per is None else {d: per[s] for d, s in pairs.items() if s in per}
    return tuple(pick(per) for per in _records(shallow_gm, mode, args, autocast))


def autocast_policy(dtype: str, autocast: str | None) -> str | None:
    """The autocast record a capture makes: only of a bf16 capture (costmodel.capture.autocast.POLICIES)."""
    if autocast is not None and autocast not in POLICIES:
        raise PartitaError(f"autocast must be one of {', '.join(POLICIES)} or None, got {autocast!r}")
    return autocast if dtype == "bf16" else None


def _capture_fx(spec: ModelSpec, dtype: str, batch: int, autocast: str | None = None) -> OpGraph:
    t0 = time.perf_counter()
    gm, mode, args, strip = _trace_fx(spec, dtype, batch)
    # every name a parameter has (a tied weight has two, `head.weight` and `tok_emb.weight`); its numel and
    # bytes are counted once, on the first name named_parameters() gives it (`_counted_params`)
    params = dict(gm.named_parameters(remove_duplicate=False))
    first = _first_names(gm)
    stats, memory, mixed = (_record_from_shallow(spec, gm, dtype, batch, autocast)
                            or _records(gm, mode, args, autocast))
    graph = OpGraph(name=spec.name, batch=batch, seq_len=spec.seq_len, dtype=dtype)
    owned = _params_by_node(gm)
    for n in gm.graph.nodes:
        if n.op == "output" or n.name not in stats:
            continue  # concrete (unused) arguments are never run
        st = stats[n.name]
        owner = _owner(n, gm)
        owner = owner[len(strip):] if owner.startswith(strip) else ("" if owner == strip.rstrip(".") else owner)
        pnames = owned.get(n.name, [])
        kind = _kind(n, gm)
        graph.add_node(
            n.name, op=n.op, target=str(n.target), kind=kind, module=owner,
            shape=st["shape"], dtype=st["dtype"], fwd_flops=st["fwd_flops"], bwd_flops=st["bwd_flops"],
            alias=st["alias"], **memory[n.name],
            params={p[len(strip):]: params[p].numel() for p in pnames if first[p] == p},
            **_dim_args(n, stats),
            **({"weight_layout": "out_in"} if kind == "linear" else {}),
            param_bytes=sum(params[p].numel() * params[p].element_size() for p in pnames if first[p] == p),
            **({"tied": {p[len(strip):]: first[p][len(strip):] for p in pnames if first[p] != p}}
               if any(first[p] != p for p in pnames) else {}),
            **({"uncosted": st["uncosted"]} if st["uncosted"] else {}),
            **({"autocast": mixed[n.name]} if mixed else {}),
        )
        for a in n.all_input_nodes:
            if a.name in stats:
                graph.add_edge(a.name, n.name, nbytes=stats[a.name]["out_bytes"])
    if mixed:
        graph.g.graph["autocast"] = autocast
    graph.finalize(capture_seconds=time.perf_counter() - t0)
    return graph


def _first_names(gm: fx.GraphModule) -> dict[str, str]:
    """Each parameter name -> the first name of the same tensor (itself, unless the weight is tied)."""
    first: dict[int, str] = {}
    out = {}
    for name, p in gm.named_parameters(remove_duplicate=False):
        out[name] = first.setdefault(id(p), name)
    return out


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


def _dim_args(n: fx.Node, stats: dict, name: str | None = None) -> dict:
    """The dims an op works along, normalised, for sharding propagation (planner.enumerate.strategies).

    `name` overrides the op name read from the node (the export capture passes its normalised kind; aten
    ops take their dims at the same argument positions as the torch functions).
    """
    name = name or getattr(n.target, "__name__", str(n.target))
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
    elif name == "grouped_mm" and len(n.args) > 1 and isinstance(n.args[1], fx.Node):
        weight = stats.get(n.args[1].name, {}).get("shape", ())  # one GEMM per expert (costmodel.price.kernels)
        out.update({"groups": weight[0]} if len(weight) == 3 else {})
    elif name == "scaled_dot_product_attention":
        # is_causal: F.scaled_dot_product_attention's 6th argument; an aten overload says where in its schema
        schema = getattr(n.target, "_schema", None)
        names = [a.name for a in schema.arguments] if schema is not None else []
        at = names.index("is_causal") if "is_causal" in names else 5
        causal = n.kwargs.get("is_causal", n.args[at] if len(n.args) > at else False)
        out.update({"causal": True} if causal is True else {})
    elif name in ("view", "reshape"):
        sizes = n.args[1] if len(n.args) == 2 and isinstance(n.args[1], (list, tuple)) else n.args[1:]
        out["infer_dim_at"] = next((i for i, v in enumerate(sizes) if isinstance(v, int) and v == -1), -1)
    elif name in ("softmax", "log_softmax", "cat", "chunk", "split", "narrow", "mean", "sum"):
        dim = n.kwargs.get("dim")
        if dim is None:
            pos = {"chunk": 2, "split": 2, "narrow": 1, "cat": 1}.get(name, 1)
            dim = n.args[pos] if len(n.args) > pos else 0
        if isinstance(dim, (list, tuple)) and len(dim) == 1:
            dim = dim[0]
        if isinstance(dim, int):
            out["reduce_dim"] = norm(dim)
    return out
