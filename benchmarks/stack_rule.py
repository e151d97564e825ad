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
    eager        sdpa, math                >= 2.11  any           pytorch
    eager        sdpa, flash2, math        < 2.5    none          flash-2023
    eager        sdpa, flash2, math        >= 2.5   any           pytorch-fa2

Why these: the stack fixes which kernels run (its attention kernel, whether memory-bound operators are fused)
and which overlaps exist (costmodel.hardware.stacks); megatron-2021's fused-attention kernel is FlashAttention-2, so a
fused-kernel trainer that calls flash-attn 2 without Transformer Engine runs that stack's kernels. SDPA's choice
on Hopper is the line between the eager stacks: torch 2.5.0 put cuDNN attention first, 2.5.1 made it opt-in
again (pytorch/pytorch#138522, 2024-10), and it is first again only with a bundled cuDNN >= 9.15, which torch
first ships in 2.11. So an SDPA run on torch 2.5-2.10 runs FlashAttention-2, as the flash-attn 2 package does on
any torch: pytorch-fa2 runs flash-2023's kernels (and is priced with its constants) and adds async TP, which
torch 2.5 brought. "major.minor" cannot name 2.5.0 alone; a run on exactly 2.5.0 is placed with 2.5.

History: until 2026-11-29 the table said "torch >= 2.5: pytorch" (cuDNN attention). It was mended after
torchtitan's 2025-06 async-TP rows (torch nightly 2025-06-14, SDPA) were priced 31-70% too fast on cuDNN's
rates; the sources above, not those errors, say which kernel ran. No first-contact row was on either rule.

Constants per stack (costmodel/fitted_constants.json, benchmarks.fit): every (generation, stack) group has the
same kernel fields; what a stack adds over the shared ones is its fitted GEMM level (shared by stacks of one
GEMM family), its attention level, and for eager stacks the rate of memory-bound operators. pytorch-fa2 adds none: it is
fitted and priced with flash-2023's (`Stack.constants`).
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
    """"any", or a comparison with a "major.minor" release: ">=2.11", "<2.5"."""
    tp_overlap: tuple[str, ...]
    stack: str


ANY_OVERLAP = TP_OVERLAP
RULES: tuple[Rule, ...] = (
    Rule(("te",), ("cudnn", "sdpa", "math"), "any", ANY_OVERLAP, "te-2024"),
    Rule(("te",), ("flash2",), "any", ANY_OVERLAP, "te-2024-flash2"),
    Rule(("fused",), ("flash1",), "any", ("none",), "flash1-2022"),
    Rule(("fused",), ("math", "flash2"), "any", ("none",), "megatron-2021"),
    Rule(("eager",), ("flash_triton",), "any", ("none",), "triton-2023"),
    Rule(("eager",), ("sdpa", "math"), ">=2.11", ANY_OVERLAP, "pytorch"),
    Rule(("eager",), ("sdpa", "flash2", "math"), "<2.5", ("none",), "flash-2023"),
    Rule(("eager",), ("sdpa", "flash2", "math"), ">=2.5", ANY_OVERLAP, "pytorch-fa2"),
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
    op, bound = (">=", condition[2:]) if condition.startswith(">=") else ("<", condition[1:])
    return v >= _torch(bound) if op == ">=" else v < _torch(bound)


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
