"""The plan's `sync` section: how the data-parallel replicas keep their weights in agreement (part of the plan
contract the runtime reads; stdlib only).

    sync         {"mode": "synchronous"}   absent: synchronous (plans written before the section load unchanged,
                 and a plan in the default mode is written without it, byte for byte as before)
                 {"mode": "compressed"}    synchronous, the gradients all-reduced in bf16
                 {"mode": "diloco", "options": {"every": H, "outer_lr": 0.7, "outer_momentum": 0.9, "bits": 32,
                                                "islands": I}}   every required; the rest default as shown (islands:
                                                                 one per data-parallel replica)
                 {"mode": "powersgd", "options": {"rank": 4, "start": 1000}}   gradients as rank-r factors after
                                                                               `start` plain steps
                 {"mode": "localsgd", "options": {"every": H, "bits": 32, "islands": I}}   every H steps the
                                                                               replicas' mean
                 {"mode": "streaming", "options": {"every": H, "fragments": 4, "delay": 1, "alpha": 0.5, ...}}
                                                    DiLoCo's options, and: the fragments synchronised in turn, the
                                                    inner steps each fragment's all-reduce overlaps (tau), and the
                                                    share of the local fragment kept at the merge

A sync mode is one registry entry here (its name, what it means, the options it takes, what the planner, the
report and the exporters need to know of it), one price function in the planner's estimate layer
(planner.estimate.sync.PRICES) and one hook class in the runtime's trainer loop (runtime.loop.sync.HOOKS), each
found by the entry (a mode may price or run as another): synchronous data parallelism, the same with
bf16-compressed or PowerSGD's low-rank gradients, DiLoCo, streaming DiLoCo (the asynchronous mode: no replica ever
waits for the slow link unless its all-reduce outlasts the overlap), and local SGD (DiLoCo's outer step at lr 1
without momentum: the replicas' mean).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from partita.planner.plan.sections import COUNT, NUMBER, POSITIVE, checked


@dataclass(frozen=True, kw_only=True)
class SyncMode:
    """A registry entry: a sync mode's name, what it does in one line, and the options its section may hold."""

    name: str
    summary: str
    options: dict[str, Any] = field(default_factory=dict)
    """{option name: what it may be} (planner.plan.sections specs); {}: the mode takes none."""
    defaults: dict[str, Any] = field(default_factory=dict)
    """The value of each option a section leaves out."""
    check: Callable[[dict], str | None] | None = None
    """One line on what is wrong with options that fit their specs but not each other or the mode (None: fine)."""
    priced_as: str | None = None
    """The mode whose price function (planner.estimate.sync.PRICES) prices this one; None: its own, by name."""
    runs_as: str | None = None
    """The mode whose runtime hook (runtime.loop.sync.HOOKS) runs this one; None: its own, by name."""
    as_synchronous: bool = False
    """The update is synchronous data parallelism's, exactly: nothing to say beside a plan on one island, no
    quality trade to weigh when choosing, and other tools' plain data-parallel arguments reproduce it."""
    crosses: str = "the gradients"
    """What the mode all-reduces over the island link, as the report says it."""
    holds: str = ""
    """What the memory it adds per rank is, as the report says it ("": none)."""
    ddp_replicas_only: bool = False
    """The runtime runs the mode on DDP replicas only (zero 0, no tp/pp/cp/ep; planner.plan.executable)."""
    outer_step: bool = False
    """The mode trains islands apart between outer steps, every H steps (option `every`, chosen from the planner's
    ladder when not given: planner.estimate.sync); it needs islands to run, and a 4-bit wire (`bits`) is its."""
    shards_in_islands: bool = False
    """With ddp_replicas_only: ZeRO 2 and 3 run too, FSDP sharding each island's replicas among themselves (the
    islands apart between outer steps), still without tp/pp/cp/ep."""
    tensor_parallel: bool = False
    """With ddp_replicas_only: tensor parallelism inside each replica runs too (zero 0): each tp rank's outer
    exchange is its own shard, with the ranks holding the same shard in the other islands."""
    envelope_every: int | None = None
    """With outer_step: the largest H inside the mode's published quality envelope (planner.estimate.sync refuses a
    larger one unless the user allows it); None: no envelope cited, H is the user's."""
    in_auto: bool = True
    """`--sync auto` may choose it: False for a mode with no published quality envelope cited here (asked for by
    name only)."""
    pipeline: bool = False
    """With ddp_replicas_only: pipeline parallelism inside each replica runs too (zero 0, with or without tensor
    parallelism): each stage's outer exchange is its own parameters, with the same stage in the other islands."""

    @property
    def price(self) -> str:
        return self.priced_as or self.name

    @property
    def hook(self) -> str:
        return self.runs_as or self.name


SYNCHRONOUS = "synchronous"
COMPRESSED = "compressed"
DILOCO = "diloco"
STREAMING = "streaming"
POWERSGD = "powersgd"
LOCALSGD = "localsgd"
OUTER_BITS = (4, 16, 32)
"""The bit widths of DiLoCo's and streaming DiLoCo's outer exchange: 32 (fp32), 16 (bf16), or 4 (blockwise 4-bit
integers in two phases, runtime.loop.sync.four_bit)."""
FOUR_BIT_BLOCK = 64
"""Elements per fp32 scale of the 4-bit outer exchange."""


def wire_bits(bits: int) -> float:
    """Bits per element the outer exchange moves at width `bits`: the 4-bit one adds its scales (32 bits per
    FOUR_BIT_BLOCK elements)."""
    return bits + 32 / FOUR_BIT_BLOCK if bits == 4 else float(bits)


DILOCO_MAX_EVERY = 500
"""The largest H (inner steps per outer step) inside DiLoCo's quality envelope: the paper's main setting, 8 workers
at H = 500 (Douillard et al. 2023, arXiv:2311.08105). A larger H is priced only when the user allows it."""


def _diloco_problem(options: dict) -> str | None:
    """What is wrong with DiLoCo options that fit their specs: H of 1 or more, bits 4, 16 or 32, momentum in
    [0, 1)."""
    if "every" not in options:
        return "sync.options.every (H, the inner steps per outer step) is required by the diloco mode"
    if options["every"] < 1:
        return f"sync.options.every is the inner steps per outer step (H), 1 or more; got {options['every']!r}"
    if options.get("bits", 32) not in OUTER_BITS:
        return f"sync.options.bits is the outer all-reduce's bit width, 4, 16 or 32; got {options['bits']!r}"
    if not 0 <= options.get("outer_momentum", 0.9) < 1:
        return f"sync.options.outer_momentum must be in [0, 1); got {options['outer_momentum']!r}"
    return None


def _localsgd_problem(options: dict) -> str | None:
    """DiLoCo's checks of H and bits (local SGD has no outer optimizer to set)."""
    if why := _diloco_problem(options):
        return why.replace("diloco", "localsgd")
    return None


def _streaming_problem(options: dict) -> str | None:
    """DiLoCo's checks, and: 1 <= fragments <= H, 0 <= delay < H // fragments (one fragment's all-reduce in
    flight at a time: it lands before the next fragment's starts), alpha in [0, 1]."""
    if why := _diloco_problem(options):
        return why.replace("diloco", "streaming")
    every, fragments = options["every"], options.get("fragments", 4)
    if not 1 <= fragments <= every:
        return (f"sync.options.fragments ({fragments}) must be from 1 to H = {every}: each fragment takes its outer "
                "step once every H steps, one fragment at a time")
    if options.get("delay", 1) >= every // fragments:
        return (f"sync.options.delay ({options.get('delay', 1)}) must be less than H / fragments = "
                f"{every // fragments}: a fragment's all-reduce must land before the next fragment's starts; "
                "raise H, or use fewer fragments or a shorter delay")
    if not 0 <= options.get("alpha", 0.5) <= 1:
        return f"sync.options.alpha is the share of the local fragment kept at the merge, in [0, 1]; got {options['alpha']!r}"
    return None


def _powersgd_problem(options: dict) -> str | None:
    """rank 1 or more; start 2 or more (torch's PowerSGDState: error feedback and warm start begin after DDP's first
    two steps, which run a plain all-reduce)."""
    if options.get("rank", 4) < 1:
        return f"sync.options.rank is the rank of PowerSGD's gradient factors, 1 or more; got {options['rank']!r}"
    if options.get("start", 1000) < 2:
        return (f"sync.options.start is the step from which PowerSGD compresses, 2 or more (the steps before run a "
                f"plain all-reduce); got {options['start']!r}")
    return None


SYNC_MODES: dict[str, SyncMode] = {
    SYNCHRONOUS: SyncMode(name=SYNCHRONOUS, as_synchronous=True,
                          summary="synchronous data parallelism: gradients averaged over dp in every step's backward "
                                  "(DDP's buckets, FSDP's reduce-scatter), before the optimizer step"),
    COMPRESSED: SyncMode(
        name=COMPRESSED, crosses="the gradients in bf16", ddp_replicas_only=True,
        summary="synchronous data parallelism with the gradients all-reduced in bf16 (as PyTorch's DDP "
                "communication hook bf16_compress_hook and Megatron-LM's --grad-reduce-in-bf16 do): half the bytes of fp32 gradients on "
                "every link, each averaged gradient rounded to bf16's 8 significant bits before the optimizer step"),
    DILOCO: SyncMode(
        name=DILOCO, crosses="the parameter change", ddp_replicas_only=True, holds="anchor and outer momentum",
        outer_step=True, shards_in_islands=True, tensor_parallel=True, pipeline=True, envelope_every=DILOCO_MAX_EVERY,
        summary="DiLoCo (Douillard et al. 2023, arXiv:2311.08105): synchronous inside each island; across islands "
                "every H steps the mean parameter change is applied to the anchor weights by an outer Nesterov SGD "
                "step (lr 0.7, momentum 0.9 as published). Published quality: on C4, 8 workers at H = 500 performed "
                f"as well as fully synchronous training while communicating 500 times less; H above "
                f"{DILOCO_MAX_EVERY} is outside that envelope",
        options={"every": COUNT, "outer_lr": POSITIVE, "outer_momentum": NUMBER, "bits": COUNT, "islands": COUNT},
        defaults={"outer_lr": 0.7, "outer_momentum": 0.9, "bits": 32},
        check=_diloco_problem),
    POWERSGD: SyncMode(
        name=POWERSGD, crosses="the gradients as rank-r factors", ddp_replicas_only=True,
        holds="error feedback and the factors kept for warm start",
        summary="synchronous data parallelism with PowerSGD's low-rank gradients (Vogels et al. 2019, "
                "arXiv:1905.13727; PyTorch's powerSGD_hook): after `start` plain all-reduce steps (torch's default "
                "1000) each gradient matrix of m x n is all-reduced as two rank-r factors, r (m + n) elements, with "
                "error feedback (what the compression lost is added to the next step's gradient); vectors, and "
                "matrices that would not shrink 2x, go as they are. The update is an "
                "approximation of synchronous SGD's, corrected over steps by the error feedback",
        options={"rank": COUNT, "start": COUNT}, defaults={"rank": 4, "start": 1000}, check=_powersgd_problem),
    STREAMING: SyncMode(
        name=STREAMING, crosses="the parameter change of one fragment", ddp_replicas_only=True, outer_step=True,
        shards_in_islands=True, tensor_parallel=True, pipeline=True, envelope_every=DILOCO_MAX_EVERY,
        holds="anchor, outer momentum and the fragment in flight",
        summary="streaming DiLoCo (Douillard et al. 2025, arXiv:2501.18512), the asynchronous mode: DiLoCo with the "
                "parameters split into fragments (strided by layer) that take their outer steps in turn, fragment p "
                "at steps p H/P + k H; each fragment's all-reduce runs while the next `delay` inner steps compute "
                "(tau; 0: it blocks), and the outer result is merged as alpha x local + (1 - alpha) x global. Peak "
                "bandwidth falls by the number of fragments and the all-reduce hides behind compute; the paper reports "
                f"a loss on par with DiLoCo's at the same H, also with 4-bit outer all-reduces (bits 4); H above "
                f"{DILOCO_MAX_EVERY} is outside the envelope",
        options={"every": COUNT, "fragments": COUNT, "delay": COUNT, "alpha": NUMBER, "outer_lr": POSITIVE,
                 "outer_momentum": NUMBER, "bits": COUNT, "islands": COUNT},
        defaults={"fragments": 4, "delay": 1, "alpha": 0.5, "outer_lr": 0.7, "outer_momentum": 0.9, "bits": 32},
        check=_streaming_problem),
    LOCALSGD: SyncMode(
        name=LOCALSGD, crosses="the parameter change", ddp_replicas_only=True, holds="the replicas' last mean",
        outer_step=True, shards_in_islands=True, tensor_parallel=True, pipeline=True, in_auto=False,
        summary="local SGD (periodic model averaging: Stich 2018, arXiv:1805.09767; Lin et al. 2020, "
                "arXiv:1808.07217): synchronous inside each island; across islands every H steps the replicas' "
                "parameters become their mean -- DiLoCo's outer step at lr 1 without momentum, so it costs DiLoCo's "
                "all-reduce and holds no outer momentum. No published envelope for language-model training is cited "
                "here, so `--sync auto` does not choose it; on partita's small-scale check "
                "(benchmarks.diloco_quality) H = 8 and 32 were within 0.2% of synchronous training",
        options={"every": COUNT, "bits": COUNT, "islands": COUNT},
        defaults={"outer_lr": 1, "outer_momentum": 0, "bits": 32}, check=_localsgd_problem),
}
"""The accepted modes, by name. A new one is added here, with a price function (planner.estimate.sync.PRICES)
and a runtime hook (runtime.loop.sync.HOOKS) of its name -- or none, where it prices or runs as an existing
mode (`priced_as`, `runs_as`)."""


@dataclass(kw_only=True)
class Sync:
    """A plan's sync choice: the mode, and its options (none for synchronous)."""

    mode: str = SYNCHRONOUS
    options: dict[str, Any] = field(default_factory=dict)

    def option(self, name: str) -> Any:
        """The value of option `name`: the section's, or the mode's default (None: neither)."""
        return self.options.get(name, SYNC_MODES[self.mode].defaults.get(name))

    @property
    def is_default(self) -> bool:
        return self.mode == SYNCHRONOUS and not self.options

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, **({"options": dict(self.options)} if self.options else {})}


def has_outer_step(mode: str) -> bool:
    """Whether registered mode `mode` trains islands apart between outer steps (SyncMode.outer_step)."""
    entry = SYNC_MODES.get(mode)
    return entry is not None and entry.outer_step


def accepted() -> str:
    return ", ".join(SYNC_MODES)


def mode_problem(mode: Any, where: str = "sync.mode") -> str | None:
    """One line when `mode` names no registered sync mode; None when it does."""
    if isinstance(mode, str) and mode in SYNC_MODES:
        return None
    shown = repr(mode) if len(repr(mode)) <= 40 else repr(mode)[:37] + "..."
    return f"{where} is {shown}; accepted: {accepted()}"


def problems(data: Any) -> list[str]:
    """What is wrong with a plan's `sync` section (None: absent); [] when nothing is."""
    if data is None:
        return []
    if not isinstance(data, dict):
        return ["sync must be a JSON object, e.g. {\"mode\": \"synchronous\"}"]
    unknown = sorted(set(data) - {"mode", "options"})
    if unknown:
        return [f"sync has unknown key {unknown[0]!r}; a sync section holds mode and options"]
    if why := mode_problem(data.get("mode")):
        return [why]
    entry, options = SYNC_MODES[data["mode"]], data.get("options", {})
    if not isinstance(options, dict):
        return ["sync.options must be a JSON object"]
    extra = sorted(set(options) - set(entry.options))
    if extra:
        takes = ", ".join(entry.options) or "none"
        return [f"sync.options.{extra[0]} is not an option of the {entry.name} mode; it takes: {takes}"]
    found = [p for name, spec in entry.options.items() if name in options
             for p in checked(options[name], spec, f"sync.options.{name}")]
    if not found and entry.check is not None and (why := entry.check(options)):
        found.append(why)
    return found


def from_section(data: Any) -> Sync:
    """The Sync of a section that `problems` found nothing wrong with (None: the default)."""
    if data is None:
        return Sync()
    return Sync(mode=data["mode"], options=dict(data.get("options", {})))
