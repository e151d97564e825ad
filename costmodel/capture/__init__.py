"""Capture: a model as an operator graph on fake tensors (fx or torch.export), its layers found and replicated, its fingerprint."""
import importlib

from partita.costmodel.errors import PartitaError


def __getattr__(name):  # a submodule loads on first use, as an attribute too
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as e:
        if e.name != f"{__name__}.{name}":  # the submodule exists; something it imports is missing
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def capture(spec: "ModelSpec", dtype: str = "fp32", batch: int = 1, autocast: str | None = "cuda") -> "OpGraph":
    """Trace `spec`'s model with its loss on fake tensors into an OpGraph (per-sample costs when batch=1).

    A bf16 capture also records the model as partita's runtime runs a bf16 plan without FSDP, under
    autocast following `autocast`'s lists ("cuda" or "cpu"; None: no such record), kept on each node as
    `autocast` (module docstring; `OpGraph.as_run`)."""
    from partita.costmodel.capture.trace import (DTYPES, CaptureFailed, _capture_fx, autocast_policy, capture_error,
                                                 register_missing_formulas)
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
            if front == "fx":
                return _capture_fx(spec, dtype, batch, autocast)
            from partita.costmodel.capture.export import capture_export  # torch.export: HF models
            return capture_export(spec, dtype, batch, autocast)
        except CaptureFailed as f:
            failures.append(f)
    raise capture_error(spec, failures)
