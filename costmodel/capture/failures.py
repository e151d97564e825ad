"""Why a model could not be captured, said in one actionable line (`capture_error`): which module was being
traced, why, and what to try. `CaptureFailed` is one front end's failure (costmodel.capture.trace, .export)."""
from __future__ import annotations

from partita.costmodel.errors import PartitaError
from partita.costmodel.models import ModelSpec


class CaptureFailed(Exception):
    """A front end could not trace the model; `module` is the innermost module FQN being traced."""

    def __init__(self, how: str, module: str | None, cls: str | None, error: BaseException):
        super().__init__(f"{how}: {type(error).__name__}: {first_line(error)}")
        self.how, self.module, self.cls, self.error = how, module, cls, error


def first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:300] if lines else ""


def capture_error(spec: ModelSpec, failures: list[CaptureFailed]) -> PartitaError:
    """One actionable message: which module (innermost FQN being traced), why, and what to try."""
    mod, cls = next(((f.module, f.cls) for f in reversed(failures) if f.module is not None), (None, None))
    where = f"module {mod!r} ({cls})" if mod else f"the top-level forward{f' ({cls})' if cls else ''}"
    detail = "; ".join(str(f) for f in failures)
    exported = [f for f in failures if f.how == "torch.export"]
    last = failures[-1].error
    if any(s in f"{type(f.error).__name__} {f.error}" for f in exported
           for s in ("data-dependent", "DataDependent")):
        reason = "its Python control flow depends on tensor values"
        hint = ("make the control flow static (decide branches from shapes or config, not from tensor values; "
                "or use torch.where / torch.cond)")
    elif not exported and "cannot be used as inputs to control flow" in detail:
        reason = "its Python control flow depends on traced values (tensor values or shapes)"
        hint = ("capture with torch.export (ModelSpec(capture='export') or 'auto'), which follows branches on "
                "shapes; if a branch reads tensor values, make the control flow static (torch.where / torch.cond)")
    elif isinstance(last, TypeError) and ("argument" in str(last) or "positional" in str(last)):
        reason = "its example inputs do not match forward()"
        hint = "pass example inputs that match the model's forward() signature"
    else:
        reason = "tracing failed"
        hint = ("make control flow static, capture with torch.export (ModelSpec(capture='export')) if only "
                "symbolic_trace was tried, and pass example inputs matching forward()")
    if spec.config.get("family") == "hf":  # transformers' code, not the user's: nothing to make static
        hint = _hf_hint(spec.config)
    return PartitaError(f"cannot capture model {spec.name!r}: {where}: {reason} ({detail}). Try: {hint}")


def _hf_hint(config: dict) -> str:
    """What a user can do when transformers' own model class cannot be captured: another family, or their own
    factory; a sequence-to-sequence model is not replaced by its decoder alone (whose cross-attention would get
    no input and, under data parallelism, no gradient)."""
    alone = (" (its decoder alone is not planned in its place: the encoder and cross-attention would go "
             "untrained)") if config.get("task") == "seq2seq" else ""
    return (f"{config.get('model')} is transformers' code{alone}: plan another hf: family, or give the model as a "
            "package.module:factory whose forward has no such branch")
