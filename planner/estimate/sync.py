"""The price of a sync mode (planner.plan.sync.SYNC_MODES): what keeping the data-parallel replicas in agreement
costs a candidate per step -- the communication no compute hides, and the memory the mode holds beyond the
model states the memory phases already count -- and the choice among the modes a SearchSpace allows.

One function per mode, of one signature, `price(predicted, setting, sync) -> SyncPrice`, over the candidate's
priced step (planner.estimate.build.predicted), where it runs (`SyncSetting`) and the mode's options: a new mode
adds its function to PRICES under the name of its registry entry, and its runtime hook to runtime.loop.sync.HOOKS.

On a cluster with islands (costmodel.hardware.Cluster.islands) the data-parallel group that spans I islands is
priced hierarchically: the in-island part as today (the breakdown's `dp_comm_s`), plus the cross-island phase on
the island link (costmodel.price.comm.cross_island_all_reduce), exposed -- nothing in the step is left to hide
a 20 ms link behind, and the MILP's bucket overlap prices the fabric inside. Per step, for P parameters:

    in-island     the breakdown's dp_comm_s, 0 when each island holds one replica (planner.estimate.sync.in_island)
    synchronous   cross = X(P * g)             g = bytes per gradient element (4: fp32 gradients, 2: pure bf16)
    compressed    cross = X(P * 2)             the gradients all-reduced in bf16 (a DDP communication hook);
                  in-island x 2 / g            the in-island exposed seconds scaled by the bytes (an
                                               approximation: its latency part does not shrink)
    diloco        cross = X(P * w / 8) / H     once every H steps the parameter change, amortised per step;
                                               w = bits, or 4.5 at 4 bits (its fp32 scale per 64 elements,
                                               planner.plan.sync.wire_bits): the two phases of the 4-bit mean
                                               (runtime.loop.sync.four_bit) move what a ring all-reduce of w bits does
                  memory + 8 P / (tp pp) / s   the fp32 anchor and outer momentum of the rank's parameters,
                                               s = dp / I under ZeRO (sharded like the optimizer state inside
                                               the island), 1 without
                         + (I - 1) Z           ZeRO 2/3 shards its states over the island's dp / I ranks, not
                                               dp: Z, the sharded states per rank as priced, I times over
    powersgd      cross = X(g (V + r sum m)) + X(g r sum n)
                                               two all-reduces per step, as torch's powerSGD_hook runs them: the
                                               uncompressed tensors V (vectors, and m x n matrices that would not
                                               shrink 2x: r (m + n) * 2 >= m n) with the P factors, then the Q
                                               factors; in-island seconds scaled by the compressed bytes, as
                                               compressed's. Steps before `start` run plain all-reduces (not
                                               priced: the steady state is). Vogels et al. 2019
                  memory + g P + g r (sum m + sum n)   torch's state: the error feedback of whole buckets
                                               and the factors kept for warm start
    streaming     cross = F / H * (X - min(X', tau * T))   X = X(P * w / 8 / F)
                                               F fragments, each all-reduced once every H steps while the next
                                               tau inner steps compute (T: the step without its data-parallel
                                               time); what outlasts them is exposed. X' = X, or X / 2 at 4 bits:
                                               only the first phase is in flight, the all-gather runs at the
                                               merge. Douillard et al. 2025
                  memory as diloco, + P * w / 8 / F / (tp pp)   the fragment in flight (at 4 bits its fp32
                                               change and its codes: P * (32 + w) / 8 / F)

with X(B) = 2 (I-1) alpha_I + 2 (I-1)/I * B / beta_I. On one island X = 0: synchronous keeps today's figures, and
DiLoCo is refused (it has nothing to save there); so are the compressed and powersgd modes when the planner chooses
("auto"), since compressing the gradients buys nothing on a slow link there -- asked for by name, each is priced on
one island too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import Cluster
from partita.costmodel.price import comm
from partita.planner.plan.sync import (COMPRESSED, DILOCO, DILOCO_MAX_EVERY, LOCALSGD, POWERSGD, STREAMING, SYNC_MODES,
                                       SYNCHRONOUS, Sync, accepted, has_outer_step, wire_bits)

DILOCO_EVERY_LADDER = (10, 20, 50, 100, 200, DILOCO_MAX_EVERY)
"""The H the planner tries for DiLoCo when the user fixes none, smallest first."""
DILOCO_SLACK = 0.05
"""The planner takes the smallest H of the ladder whose amortised cross-island time is at most this fraction of
the step without it (the largest otherwise): a smaller H stays closer to synchronous training (Douillard et al.
2023 report quality falling slowly as H grows), and past that point a larger H buys little time."""


@dataclass(frozen=True, kw_only=True)
class SyncPrice:
    """A sync mode's cost per optimizer step."""

    exposed_s: float
    """Seconds of data-parallel synchronisation on the step's critical path (part of the step time)."""
    extra_memory_bytes: int
    """Bytes per rank the mode holds beyond the model states, activations and workspace of the memory phases."""
    cross_island_s: float = 0.0
    """The part of exposed_s on the island link, per step (amortised over H for DiLoCo)."""
    cross_island_bytes: float = 0.0
    """Bytes one island sends over its link per all-reduce (each H steps for DiLoCo; one fragment's, each H / F
    steps, for streaming DiLoCo)."""
    hidden_s: float = 0.0
    """Seconds of each cross-island all-reduce that compute hides (streaming DiLoCo's overlap), not in exposed_s."""


@dataclass(frozen=True, kw_only=True)
class SyncSetting:
    """Where a candidate's replicas synchronise: the cluster, the model size and the candidate's mesh."""

    cluster: Cluster
    parameters: int
    """Parameters of the model (one replica)."""
    dp: int
    model_parallel: int = 1
    """tp x pp: how many ranks one replica's parameters are split over."""
    dp_span: int = 1
    """Consecutive ranks the data-parallel group spans (dp x the ranks between replicas)."""
    zero: int = 0
    grad_bytes: int = 4
    matrices: tuple[tuple[int, int], ...] = ()
    """The gradient matrices (m, n) of one replica's parameters (`gradient_shapes`), for PowerSGD's price."""
    vectors: int = 0
    """Elements of the other gradients (biases, norms)."""
    sharded_state_bytes: float = 0.0
    """Per rank, the model states ZeRO 2/3 shards over the whole dp group (gradients, optimizer state, stage 3's
    parameters). A mode that trains islands apart shards them over each island's dp / I ranks alone
    (runtime.parallel.apply.fsdp_mesh): I times as many bytes per rank (`_island_states`)."""

    @property
    def islands(self) -> int:
        """Islands the data-parallel group spans."""
        return comm.islands_spanned(self.cluster, self.dp_span) if self.dp > 1 else 1


def _dp_exposed(predicted: dict) -> float:
    return float(predicted.get("breakdown", {}).get("dp_comm_s", 0.0))


def in_island(predicted: dict, setting: SyncSetting | None) -> float:
    """The exposed data-parallel seconds inside the islands: the breakdown's `dp_comm_s` (priced by the MILP on
    the whole data-parallel group over the fabric: an upper bound of the in-island group's), 0 when each island
    holds one replica (nothing to average inside)."""
    if setting is not None and setting.islands > 1 and setting.dp // setting.islands <= 1:
        return 0.0
    return _dp_exposed(predicted)


def synchronous(predicted: dict, setting: SyncSetting | None = None, sync: Sync | None = None) -> SyncPrice:
    """Synchronous data parallelism: the exposed in-island gradient synchronisation of the slowest stage's flush,
    the breakdown's `dp_comm_s` (planner.estimate.build.predicted: what DDP's buckets leave uncovered, plus its
    latency and last bucket; the ZeRO stream's own traffic is `zero_comm_s`, not priced here), and the
    cross-island phase of every step's all-reduce (module docstring). No extra memory: the gradients it averages
    are model states (under DDP its buckets: planner.estimate.phases.grads_absent)."""
    nbytes = setting.parameters * setting.grad_bytes if setting else 0.0
    cross = comm.cross_island_all_reduce(setting.cluster, setting.islands, nbytes) if setting else 0.0
    return SyncPrice(exposed_s=in_island(predicted, setting) + cross, extra_memory_bytes=0, cross_island_s=cross,
                     cross_island_bytes=nbytes if cross else 0.0)


def compressed(predicted: dict, setting: SyncSetting, sync: Sync | None = None) -> SyncPrice:
    """Synchronous data parallelism on bf16 gradients (module docstring): every all-reduce moves 2 bytes per
    element instead of `grad_bytes`; the in-island exposed seconds scale by the same ratio."""
    ratio = min(1.0, 2 / setting.grad_bytes)
    nbytes = setting.parameters * 2
    cross = comm.cross_island_all_reduce(setting.cluster, setting.islands, nbytes)
    return SyncPrice(exposed_s=in_island(predicted, setting) * ratio + cross, extra_memory_bytes=0,
                     cross_island_s=cross, cross_island_bytes=nbytes if cross else 0.0)


def diloco(predicted: dict, setting: SyncSetting, sync: Sync) -> SyncPrice:
    """DiLoCo (module docstring): synchronous inside each island, the outer all-reduce of the parameter change
    every H = `every` steps across them; the anchor and, with momentum, the outer momentum in fp32 on every rank
    (local SGD, DiLoCo's step at lr 1 without momentum, holds the anchor alone)."""
    every, bits = sync.option("every"), sync.option("bits")
    nbytes = setting.parameters * wire_bits(bits) / 8
    cross = comm.cross_island_all_reduce(setting.cluster, setting.islands, nbytes) / every
    memory = _outer_state_bytes(setting, momentum=sync.option("outer_momentum") > 0)
    return SyncPrice(exposed_s=in_island(predicted, setting) + cross, extra_memory_bytes=memory,
                     cross_island_s=cross, cross_island_bytes=nbytes)


def gradient_shapes(graph) -> tuple[tuple[tuple[int, int], ...], int]:
    """(the parameters' matrices (m, n), the elements of the others) from a captured OpGraph, each parameter once.
    m is the output's channel dimension (the last one; the second for a convolution) and n the rest, as torch's
    powerSGD_hook views a gradient (shape[0], -1): the same r (m + n) either way round. A bias or a parameter of
    no more elements than m is a vector."""
    seen: dict[str, tuple[int, str, tuple]] = {}
    for _, d in graph.g.nodes(data=True):
        for name, numel in (d.get("params") or {}).items():
            seen.setdefault(name, (numel, d.get("kind", ""), tuple(d.get("shape") or ())))
    matrices, vectors = [], 0
    for name, (numel, kind, shape) in seen.items():
        m = (shape[1] if kind.startswith("conv") and len(shape) > 2 else shape[-1]) if shape else 0
        if name.endswith("bias") or m <= 0 or numel <= m or numel % m:
            vectors += numel
        else:
            matrices.append((int(m), int(numel // m)))
    return tuple(matrices), vectors


def powersgd(predicted: dict, setting: SyncSetting, sync: Sync) -> SyncPrice:
    """PowerSGD (module docstring): each step's gradients all-reduced as rank-r factors in two rounds."""
    r = sync.option("rank")
    uncompressed, p_factors, q_factors = setting.vectors, 0, 0
    for m, n in setting.matrices:
        if (m + n) * r * 2 < m * n:  # torch's _should_compress, min_compression_rate 2
            p_factors, q_factors = p_factors + r * m, q_factors + r * n
        else:
            uncompressed += m * n
    g = setting.grad_bytes  # the hook sends and keeps the buckets' own dtype
    first, second = g * (uncompressed + p_factors), g * q_factors
    cross = comm.cross_island_all_reduce(setting.cluster, setting.islands, first) + \
        (comm.cross_island_all_reduce(setting.cluster, setting.islands, second) if second else 0.0)
    total = g * (setting.vectors + sum(m * n for m, n in setting.matrices)) or 1
    ratio = min(1.0, (first + second) / total)
    extra = total + g * (p_factors + q_factors)
    return SyncPrice(exposed_s=in_island(predicted, setting) * ratio + cross, extra_memory_bytes=extra,
                     cross_island_s=cross, cross_island_bytes=first + second if cross else 0.0)


def _outer_state_bytes(setting: SyncSetting, momentum: bool = True) -> int:
    """The fp32 anchor and (with `momentum`) the outer momentum of this rank's parameters (sharded like the
    optimizer state under ZeRO), and what sharding ZeRO 2/3's states over an island instead of every replica adds
    (`_island_states`)."""
    shards = max(1, setting.dp // setting.islands) if setting.zero >= 1 else 1
    per_parameter = 8 if momentum else 4
    return per_parameter * setting.parameters // (setting.model_parallel * shards) + _island_states(setting)


def _island_states(setting: SyncSetting) -> int:
    """The ZeRO-sharded states' bytes beyond the estimator's (sharded over dp): FSDP over dp / I ranks holds I x
    them (SyncSetting.sharded_state_bytes)."""
    return int(setting.sharded_state_bytes * (setting.islands - 1)) if setting.islands > 1 else 0


def streaming(predicted: dict, setting: SyncSetting, sync: Sync) -> SyncPrice:
    """Streaming DiLoCo (module docstring): F fragments take their outer steps in turn, each all-reduce overlapped
    with the next `delay` inner steps; the anchor, the outer momentum and the fragment in flight in memory."""
    every, bits, fragments = sync.option("every"), sync.option("bits"), sync.option("fragments")
    nbytes = setting.parameters * wire_bits(bits) / 8 / fragments
    one = comm.cross_island_all_reduce(setting.cluster, setting.islands, nbytes)
    # at 4 bits only the first phase (the reduce-scatter half) is in flight; the all-gather runs at the merge
    overlapped = one / 2 if bits == 4 else one
    hidden = min(overlapped, sync.option("delay") * (predicted["step_time_s"] - _dp_exposed(predicted)))
    cross = (one - hidden) * fragments / every
    in_flight = setting.parameters * (32 + wire_bits(4)) / 8 / fragments if bits == 4 else nbytes
    extra = _outer_state_bytes(setting) + int(in_flight) // setting.model_parallel
    return SyncPrice(exposed_s=in_island(predicted, setting) + cross, extra_memory_bytes=extra, cross_island_s=cross,
                     cross_island_bytes=nbytes, hidden_s=hidden)


PRICES: dict[str, Callable[..., SyncPrice]] = {SYNCHRONOUS: synchronous, COMPRESSED: compressed, DILOCO: diloco,
                                               STREAMING: streaming, POWERSGD: powersgd, LOCALSGD: diloco}
"""A price function per registered sync mode (the same names as planner.plan.sync.SYNC_MODES)."""


def sync_price(mode: str, predicted: dict, setting: SyncSetting | None = None, sync: Sync | None = None) -> SyncPrice:
    """The price of sync mode `mode` for a candidate whose step is priced as `predicted`."""
    if mode not in SYNC_MODES or SYNC_MODES[mode].price not in PRICES:
        raise PartitaError(f"sync mode {mode!r} has no price; accepted: {accepted()}")
    return PRICES[SYNC_MODES[mode].price](predicted, setting, sync or Sync(mode=mode))


# ------------------------------------------------------------------------------------------- choice

def refusal(sync: Sync, setting: SyncSetting, allow_any_every: bool = False) -> str | None:
    """Why `sync` cannot run, or is outside its quality envelope, for this candidate; None when it may."""
    if not has_outer_step(sync.mode):
        return None
    if setting.islands < 2:
        return (f"{sync.mode} trains islands apart and this plan's data-parallel group spans one island; give a "
                "cluster with islands, e.g. 2x8x8xH100-80GB@2x100Gbps,20ms")
    every, most = sync.option("every"), SYNC_MODES[sync.mode].envelope_every
    if most is not None and every > most and not allow_any_every:
        return (f"{sync.mode} with H = {every} is outside the published envelope (H <= {most}: Douillard "
                "et al. 2023); allow it with sync_allow_any_every (--sync-allow-any-every)")
    return None


def _candidates(mode: str, predicted: dict, setting: SyncSetting, every: int | None, bits: int | None,
                fragments: int | None = None, delay: int | None = None) -> list[Sync]:
    if not has_outer_step(mode):
        return [Sync(mode=mode)]
    opts = {"bits": bits} if bits else {}
    if mode == STREAMING:
        opts.update({k: v for k, v in (("fragments", fragments), ("delay", delay)) if v is not None})
    if every is not None:
        return [Sync(mode=mode, options={"every": every, **opts})]
    base = predicted["step_time_s"]
    ladder = [Sync(mode=mode, options={"every": h, **opts}) for h in DILOCO_EVERY_LADDER]
    ladder = [s for s in ladder if SYNC_MODES[mode].check(s.options) is None] or ladder[-1:]
    for s in ladder:
        if PRICES[mode](predicted, setting, s).cross_island_s <= DILOCO_SLACK * base:
            return [s]
    return ladder[-1:]


def modes_of(sync) -> tuple[str, ...]:
    """The modes a SearchSpace's `sync` allows: "auto" (every registered mode), one name, or a tuple of names."""
    if sync == "auto":
        return tuple(m for m, entry in SYNC_MODES.items() if entry.price in PRICES and entry.in_auto)
    return (sync,) if isinstance(sync, str) else tuple(sync)


def choose(predicted: dict, setting: SyncSetting, allowed, every: int | None = None, bits: int | None = None,
           allow_any_every: bool = False, fragments: int | None = None,
           delay: int | None = None) -> tuple[Sync, SyncPrice, dict]:
    """The fastest of the `allowed` modes (SearchSpace.sync) that may run inside its envelope and fits memory:
    (its Sync, its price, {mode: predicted step seconds, or why not}). A mode other than synchronous replaces an
    earlier one only when it is more than DILOCO_SLACK faster: it trades some quality for its time, and a few
    percent is inside the cost model's own error. One line when none may run."""
    step0 = predicted["step_time_s"] - _dp_exposed(predicted)
    room = predicted.get("memory_capacity_bytes", float("inf")) - predicted.get("peak_memory_bytes", 0)
    best, priced = None, {}
    for mode in modes_of(allowed):
        if mode in (COMPRESSED, POWERSGD) and allowed == "auto" and setting.islands < 2:
            continue  # nothing on a slow link to save (module docstring)
        for sync in _candidates(mode, predicted, setting, every, bits, fragments, delay):
            if why := (SYNC_MODES[mode].check and SYNC_MODES[mode].check(sync.options)) \
                    or refusal(sync, setting, allow_any_every):
                priced[mode] = why
                continue
            price = sync_price(mode, predicted, setting, sync)
            if price.extra_memory_bytes and price.extra_memory_bytes > room:
                priced[mode] = (f"{mode} needs {price.extra_memory_bytes / 2**30:.2f} GiB more per rank than the plan "
                                f"leaves free ({max(0, room) / 2**30:.2f} GiB)")
                continue
            priced[mode] = step0 + price.exposed_s
            handicap = 1.0 if SYNC_MODES[mode].as_synchronous else 1.0 - DILOCO_SLACK
            if best is None or priced[mode] < handicap * priced[best[0].mode]:
                best = (sync, price)
    if best is None:
        raise PartitaError("no sync mode may run: " + "; ".join(f"{m}: {w}" for m, w in priced.items()))
    return best[0], best[1], priced


def with_sync(predicted: dict, sync: Sync, price: SyncPrice, priced: dict, islands: int) -> dict:
    """`predicted` with the chosen mode's synchronisation in place of the estimator's `dp_comm_s` (in-island
    and cross-island seconds: step, throughput, breakdown, `exposed_comm_s`) and its memory added and a `sync` entry for explain; unchanged on one island in synchronous mode,
    so single-island predictions stay what they were."""
    if islands < 2 and SYNC_MODES[sync.mode].as_synchronous:
        return predicted
    out = dict(predicted)
    dp_comm = _dp_exposed(predicted)
    step = predicted["step_time_s"] - dp_comm + price.exposed_s
    for key in ("tokens_per_s", "samples_per_s", "tflops_per_device", "mfu", "hfu"):
        if key in out:
            out[key] = out[key] * predicted["step_time_s"] / step
    out["step_time_s"] = step
    out["breakdown"] = {**predicted.get("breakdown", {}), "dp_comm_s": price.exposed_s - price.cross_island_s,
                        "cross_island_s": price.cross_island_s}
    out["exposed_comm_s"] = predicted.get("exposed_comm_s", 0.0) - dp_comm + price.exposed_s
    out["peak_memory_bytes"] = predicted.get("peak_memory_bytes", 0) + price.extra_memory_bytes
    shown = {STREAMING: ("every", "fragments", "delay"), DILOCO: ("every",), LOCALSGD: ("every",),
             POWERSGD: ("rank", "start")}.get(sync.mode, ())
    out["sync"] = {"mode": sync.mode, **{k: sync.option(k) for k in shown},
                   **({"hidden_s": price.hidden_s} if sync.mode == STREAMING else {}),
                   "islands": islands, "cross_island_s": price.cross_island_s,
                   "cross_island_bytes": price.cross_island_bytes, "extra_memory_bytes": price.extra_memory_bytes,
                   "priced": priced}
    return out
