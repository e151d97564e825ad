"""Which software stack (costmodel.hardware.stacks) a published run is priced on, from what the run used -- a rule written
down before the rows it is applied to, so that no stack is ever chosen by looking at a row's error.

A run is described by four facts its source states (`RunFacts`):

    elementwise  how its memory-bound operators (norms, activations, residual adds, rotary) ran:
                 "te"     Transformer Engine's fused modules (Megatron-Core, NeMo >= 23)
                 "fused"  apex / Megatron / flash-attn / xformers fused kernels, no Transformer Engine
                 "eager"  eager PyTorch kernels, one or more per operator
    attention    the attention kernel: "math" (scores materialised), "flash1" (flash-attn < 2), "flash2"
                 (flash-attn 2.x package), "flash_triton" (FlashAttention written in Triton), "sdpa" (torch's
                 scaled_dot_product_attention, whatever it dispatches), "cudnn" (cuDNN fused attention)
    torch        the torch release, "major.minor" ("" where the source does not say)
    tp_overlap   how tensor-parallel collectives overlapped GEMMs: "none", "userbuffers" (Transformer Engine),
                 "async-tp" (torch.compile + symmetric memory)

`RULES` is read top to bottom; the first rule whose conditions all hold names the stack. A user applies the same
table to their own setup. A run no rule matches has no stack: its rows are not priced (the source is skipped and
says why), never priced on a stack picked by hand.

    elementwise  attention                 torch    tp_overlap    stack
    te           cudnn, sdpa, math         any      any           te-2024
    te           flash2                    any      any           te-2024-flash2
    fused        flash1                    any      none          flash1-2022
    fused        math, flash2              any      none          megatron-2021
    eager        flash_triton              any      none          triton-2023
    eager        sdpa, flash2, math        >= 2.5   any           pytorch
    eager        sdpa, flash2, math        < 2.5    none          flash-2023

Why these: the stack fixes which kernels run (its attention kernel, whether memory-bound operators are fused)
and which overlaps exist (costmodel.hardware.stacks); megatron-2021's fused-attention kernel is FlashAttention-2, so a
fused-kernel trainer that calls flash-attn 2 without Transformer Engine runs that stack's kernels; torch 2.5
made cuDNN attention SDPA's first choice on Hopper, the line between flash-2023 and pytorch.

Constants per stack (costmodel/fitted_constants.json, benchmarks.fit): every (generation, stack) group has the
same kernel fields; what a stack adds over the shared ones is its fitted GEMM level (shared by stacks of one
GEMM family), its attention level, and for eager stacks the rate of memory-bound operators.
"""
from __future__ import annotations

import dataclasses

ELEMENTWISE = ("te", "fused", "eager")
ATTENTION = ("math", "flash1", "flash2", "flash_triton", "sdpa", "cudnn")
TP_OVERLAP = ("none", "userbuffers", "async-tp")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunFacts:
    """What a published run used, as its source states it (the inputs of `RULES`)."""

    framework: str
    """The trainer and its version, as the source names them (informational: the rule does not read it)."""
    elementwise: str
    attention: str
    torch: str = ""
    """"major.minor"; "" where the source does not say."""
    tp_overlap: str = "none"

    def __post_init__(self):
        for name, allowed in (("elementwise", ELEMENTWISE), ("attention", ATTENTION), ("tp_overlap", TP_OVERLAP)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"RunFacts.{name} {getattr(self, name)!r} is not one of {', '.join(allowed)}")


@dataclasses.dataclass(frozen=True)
class Rule:
    elementwise: tuple[str, ...]
    attention: tuple[str, ...]
    torch: str
    """"any", ">=2.5" or "<2.5"."""
    tp_overlap: tuple[str, ...]
    stack: str


ANY_OVERLAP = TP_OVERLAP
RULES: tuple[Rule, ...] = (
    Rule(("te",), ("cudnn", "sdpa", "math"), "any", ANY_OVERLAP, "te-2024"),
    Rule(("te",), ("flash2",), "any", ANY_OVERLAP, "te-2024-flash2"),
    Rule(("fused",), ("flash1",), "any", ("none",), "flash1-2022"),
    Rule(("fused",), ("math", "flash2"), "any", ("none",), "megatron-2021"),
    Rule(("eager",), ("flash_triton",), "any", ("none",), "triton-2023"),
    Rule(("eager",), ("sdpa", "flash2", "math"), ">=2.5", ANY_OVERLAP, "pytorch"),
    Rule(("eager",), ("sdpa", "flash2", "math"), "<2.5", ("none",), "flash-2023"),
)


class NoStack(ValueError):
    """No rule matches a run's facts."""


def _torch(version: str) -> tuple[int, int] | None:
    try:
        major, minor = version.split(".")[:2]
        return int(major), int(minor)
    except ValueError:
        return None


def _torch_holds(condition: str, version: str) -> bool:
    if condition == "any":
        return True
    v = _torch(version)
    if v is None:
        return False  # a rule that needs the torch release does not match a run that does not state it
    return v >= (2, 5) if condition == ">=2.5" else v < (2, 5)


def rule_for(facts: RunFacts) -> tuple[int, Rule]:
    """(index in RULES, rule) of the first rule the facts satisfy; NoStack where none does."""
    for i, rule in enumerate(RULES):
        if (facts.elementwise in rule.elementwise and facts.attention in rule.attention
                and facts.tp_overlap in rule.tp_overlap and _torch_holds(rule.torch, facts.torch)):
            return i, rule
    raise NoStack(f"no stack rule matches {dataclasses.asdict(facts)} (benchmarks/stack_rule.py RULES)")


def stack_for(facts: RunFacts) -> str:
    """The stack `RULES` assigns to a run with these facts."""
    return rule_for(facts)[1].stack
