"""Capture: a model as an operator graph on fake tensors (fx or torch.export), its layers found and replicated, its fingerprint."""
import contextlib
import math
from typing import TYPE_CHECKING

from partita.costmodel.errors import PartitaError
from partita.costmodel.lazy import submodules

if TYPE_CHECKING:  # the capture machinery imports torch: loaded where used
    from partita.costmodel.capture.graph import OpGraph
    from partita.costmodel.models import ModelSpec


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too


def capture(spec: "ModelSpec", dtype: str = "fp32", batch: int = 1, autocast: str | None = "cuda") -> "OpGraph":
    """Trace `spec`'s model with its loss on fake tensors into an OpGraph (per-sample costs when batch=1).

    A bf16 capture also records the model as partita's runtime runs a bf16 plan without FSDP, under
    autocast following `autocast`'s lists ("cuda" or "cpu"; None: no such record), kept on each node as
    `autocast` (module docstring; `OpGraph.as_run`)."""
    from partita.costmodel.capture.fake import DTYPES
    from partita.costmodel.capture.failures import CaptureFailed, capture_error
    from partita.costmodel.capture.trace import _capture_fx, autocast_policy
    from partita.costmodel.price.flops import register_missing_formulas
    if dtype not in DTYPES:
        raise PartitaError(f"unknown dtype {dtype!r}; accepted: {', '.join(DTYPES)}")
    autocast = autocast_policy(dtype, autocast)
    how = getattr(spec, "capture", "auto") or "auto"
    if how not in ("fx", "export", "auto"):
        raise PartitaError(f"model {spec.name!r}: capture must be 'fx', 'export' or 'auto', got {how!r}")
    register_missing_formulas()
    failures: list[CaptureFailed] = []
    for front in (["fx", "export"] if how == "auto" else [how]):
        try:
            with _one_sample_batch_norm():
                if front == "fx":
                    from partita.costmodel.capture.defer import deferred  # torch._dynamo left unimported
                    with deferred():
                        graph = _capture_fx(spec, dtype, batch, autocast)
                else:
                    from partita.costmodel.capture.export import capture_export  # torch.export: HF models
                    graph = capture_export(spec, dtype, batch, autocast)
        except CaptureFailed as f:
            failures.append(f)
            continue
        return _note_batch_coupling(spec, _note_batch_statistics(graph))
    raise capture_error(spec, failures)


@contextlib.contextmanager
def _one_sample_batch_norm():
    """The capture runs one sample. A BatchNorm in training mode cannot normalise one value per channel
    (BatchNorm1d after a Linear: torch refuses it, and the variance's n / (n - 1) divides by zero), so while
    capturing such a call computes with its running statistics, as in eval mode: the same shapes, the same
    elementwise work per sample (the batch mean and variance it leaves out are two reductions of its input).
    `_note_batch_statistics` then keeps the plan's micro-batches at 2 samples or more, where training runs it."""
    import torch.nn.functional as F
    batch_norm = F.batch_norm

    def one_sample_aware(input, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1,
                         eps=1e-5):  # torch.nn.functional.batch_norm's signature
        if training and running_mean is not None and input.dim() >= 2 and input.numel() == input.shape[1]:
            training = False
        return batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)

    F.batch_norm = one_sample_aware
    try:
        yield
    finally:
        F.batch_norm = batch_norm


def _note_batch_coupling(spec: "ModelSpec", graph: "OpGraph") -> "OpGraph":
    """`batch_coupled` on a graph whose loss couples the samples of a batch: why, in one phrase
    (costmodel.capture.coupling; the planner carries it into the plan, which says what --dp does to it)."""
    from partita.costmodel.capture import coupling
    why = coupling.find(spec)
    if why is not None:
        graph.g.graph["batch_coupled"] = why
    return graph


def _note_batch_statistics(graph: "OpGraph") -> "OpGraph":
    """`min_micro_batch` 2 on a graph with a batch norm over one value per channel per sample ([1, C] in the
    one-sample capture): with micro-batches of one sample, training would refuse it at its first step."""
    for _, d in graph.g.nodes(data=True):
        kind, shape = str(d.get("kind", "")), d.get("shape") or ()
        if ("batch_norm" in kind or "batchnorm" in kind) and len(shape) >= 2 and math.prod(shape[2:]) == 1:
            graph.g.graph["min_micro_batch"] = 2
            break
    return graph
