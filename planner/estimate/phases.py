"""A stage's memory at each moment it can peak (planner.solve.milp's phases), and its breakdown by category.

Measured against this machine's allocator (runtime.loop.memory.AllocatorTrace; benchmarks/fidelity.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from partita.planner.solve.milp import MemoryPhase, host_bytes, per_stage, phase_memory
from partita.planner.solve.milp_blocks import host_bytes_blocks
from partita.planner.plan import SPLIT
from partita.planner.enumerate.strategies import BlockOption

if TYPE_CHECKING:
    from partita.planner.enumerate.candidates import Candidate, _Bases
    from partita.planner.enumerate.options import Variant


def grads_absent(m: int, in_flight: np.ndarray, zero: int, dp: int, tp: int) -> np.ndarray:
    """chi_s = 1 where stage s peaks before any gradient exists: its first backward comes before its
    micro-batches run out (m <= k_s) and a step starts with none -- but not under DDP (the runtime's
    choice for zero <= 1, dp > 1, tp = 1 and one stage), whose gradient buckets, the gradients'
    storage, live on."""
    if zero <= 1 and dp > 1 and tp == 1 and len(in_flight) == 1:
        return np.zeros(len(in_flight))
    return (m <= in_flight).astype(float)


def loss_gradient_bytes(logits: float, vocab_split: bool) -> float:
    """What the token loss's backward holds at once beside the saved activations (memory_phases): the fp32
    gradients of the log-probabilities and of the logits, 2 x the logits' bytes; with the logits split over
    the vocabulary, torch's loss_parallel computes (zeros_like(x) + exp(x)) * grad, 3 x the rank's shard."""
    return (3 if vocab_split else 2) * logits


def memory_phases(bases: _Bases, opts: list[Variant], e: dict, in_flight: np.ndarray, m: int, b: int, pp: int,
                  tp: int, zero: int, dp: int, sb, sp: bool, suf: list[BlockOption],
                  gathered: float, device=None, ends: tuple[float, float] | None = None,
                  v: int = 1) -> tuple[np.ndarray, list[MemoryPhase], np.ndarray, dict]:
    """Each stage's memory at the moments it can peak (planner.solve.milp's phases); returns the main phase's
    constant per stage, the other phases, the main phase's transient workspace per stage, and what the
    caching allocator's predicted cache is made of (`device`'s allocator_cache_bytes, costmodel.hardware):
    {"stages": each stage's largest transient (`allocator_transient`), "recompute": {policy: the largest
    layer that policy re-runs}}. Where the device charges the cache (no flat headroom), the stages' share
    comes off their capacity (the candidate's) and each policy's is one more phase, gated on the stage
    holding such a layer, that bounds the cache and not the allocated peak.

    forward/backward (main): _main_phase; second backward: _second_backward; rebuild and forward end under
        autocast: _recompute_phases.
    In a pipeline, torch.distributed.pipelining also holds, per micro-batch in flight, what a stage
        received (saved by its first operator, but charged by the capture to the stage that produced it)
        and on the last stage the stage's output, the logits, which the schedule keeps for the backward:
        counted with the activations of every phase.
    With v chunks per rank each chunk in flight holds what it received; the prefix's and the suffix's chunks
        hold their own counts (`ends`, PipelineSchedule.edge_in_flight), not the stage's average over its
        chunks: interleaved, the last rank holds one micro-batch of the head (`_pipeline_activations`).
    forward/backward with ZeRO-3 gathers (binds only on stages holding a layer that reshards after its
        forward, ZeRO-3 not kept gathered): the main phase + two such layers' parameters gathered at a
        time (the one computing and the one prefetched).
    optimizer step: all model states + 2 x the largest parameter's local shard (the step's fp32
        temporaries, a per-tensor step as the runtime's optimizers take on CPU; foreach steps on GPUs
        hold more).
    Measured on this machine's allocator (runtime.loop.memory.AllocatorTrace; benchmarks/fidelity.py).
    """
    k = _graph_constants(bases)
    logits = k["out"] * b
    head_split = any(st == "vocab" for o in suf for st in o.placements.values() if o.name in SPLIT)
    logits_per_rank = logits / (tp if head_split else 1)
    boundary = k["boundary"] * b / (tp if sp else 1)
    if pp > 1:  # what the pipeline holds per micro-batch in flight (docstring): counted as activations
        e["act"] = _pipeline_activations(e["act"], k["head"] * b / (tp if head_split else 1), boundary, in_flight,
                                         ends, v)
    mp = _main_phase(k, opts, e, in_flight, grads_absent(m, in_flight, zero, dp, tp), sb.grad, pp, tp,
                     boundary, logits_per_rank, head_split)
    phases = []
    if m >= 2 and mp.chi.any():
        phases.append(_second_backward(mp, sb.grad, tp))
    resharding = np.array([zero == 3 and o.zero in (None, 3) for o in opts] or [False])
    if gathered and resharding.any():
        phases.append(MemoryPhase("forward/backward with ZeRO-3 gathers",
                                  mp.held + in_flight[:, None] * mp.act[None, :], mp.main + gathered, gate=resharding,
                                  parts={**mp.parts, "workspace": mp.workspace + gathered}))
    # (the largest parameters -- embeddings, head, layer weights -- are the ones tensor parallelism splits)
    step_tmp = 2 * 4 * k["param"] / (dp if zero >= 2 else 1) / tp
    phases.append(MemoryPhase("optimizer step", mp.states, e["state"] + step_tmp,
                              parts={"model_states": e["state"], "activations": np.zeros(pp),
                                     "workspace": np.full(pp, step_tmp)}))
    cache = {"stages": allocator_transient(k, b, pp, tp, head_split), "recompute": {}}
    phases += _allocator_cache_phases(mp, opts, b, device, cache["recompute"])
    if any(o.recompute != "none" for o in opts):
        phases += _recompute_phases(mp, opts, b, boundary + _largest_rebuild(opts, b) + gathered,
                                    bases.graph.g.graph.get("run") == "autocast")
    return mp.main, phases, mp.workspace, cache


def _pipeline_activations(act: np.ndarray, logits: float, boundary: float, in_flight: np.ndarray,
                          ends: tuple[float, float] | None, v: int) -> np.ndarray:
    """Each stage's activations per micro-batch in flight outside its layers (memory_phases' docstring), as the
    stage's count `in_flight` multiplies them: `act`'s prefix and suffix (stages 0 and -1), the `logits` the
    schedule keeps on the last stage, both rescaled to their chunk's own count (`ends`), and what each chunk in
    flight received (`boundary`)."""
    act = act.copy()
    own = act[[0, -1]].copy()  # the prefix's and the suffix's own activations (planner.enumerate.base)
    own[1] += logits
    act[-1] += logits
    first = in_flight[0] if ends is None else ends[0]
    if ends is not None:  # the ends' chunks hold their own count: rescaled, in_flight x act comes out right
        for stage, count, held in ((0, ends[0], own[0]), (len(act) - 1, ends[1], own[1])):
            act[stage] += held * (count / in_flight[stage] - 1)
    # every chunk in flight holds what it received, v x in_flight of them, but rank 0's first chunk (it receives
    # the batch, not an activation)
    received = v * in_flight
    received[0] -= first
    return act + boundary * received / in_flight


def _graph_constants(bases: _Bases) -> dict:
    """memory_phases' per-graph constants, per sample, computed once per search (kept in bases._cache): the
    widest output, the largest parameter (overall, in the first layer, the prefix, the suffix), the boundary
    activation, the head's output and the widest output of the first layer's projections."""
    graph = bases.graph
    g = graph.g
    if "memory" not in bases._cache:
        big = lambda groups: max([max(g.nodes[n]["params"].values(), default=0)
                                  for grp in groups for n in graph.nodes_of(grp)] or [0])
        bases._cache["memory"] = dict(
            out=max([d["out_bytes"] for _, d in g.nodes(data=True)] or [0]),
            param=max([max(d["params"].values(), default=0) for _, d in g.nodes(data=True)] or [0]),
            layer=big(bases.layers[:1]), prefix=big(bases.prefix), suffix=big(bases.suffix),
            boundary=graph.boundary_bytes(bases.layers[0]) if bases.layers else 0,
            head=max([d["out_bytes"] for grp in bases.suffix for n in graph.nodes_of(grp)
                      for d in [g.nodes[n]] if d["kind"] == "linear"] or [0]),
            projection=max([d["out_bytes"] for grp in bases.layers[:1] for n in graph.nodes_of(grp)
                            for d in [g.nodes[n]] if d["kind"] == "linear"] or [0]))
    return bases._cache["memory"]


@dataclass
class _MainPhase:
    """The forward/backward phase's terms, which the other phases build on (arrays per stage unless said)."""
    pp: int                      # the number of stages
    e: dict                      # the stages' fixed bytes: "state", "grad", "act"
    in_flight: np.ndarray        # k_s, micro-batches in flight
    chi: np.ndarray              # 1 where the stage peaks before any gradient exists (grads_absent)
    arriving: np.ndarray         # the gradient arriving at the stage's output (the loss's, on the last)
    per_stage_param: np.ndarray  # the stage's largest parameter (its second, transient gradient)
    workspace: np.ndarray        # arriving + the second gradient, the last stage's at its larger moment
    main: np.ndarray             # the phase's constant
    states: np.ndarray           # per option: its model states
    act: np.ndarray              # per option: a micro-batch's activations
    held: np.ndarray             # per stage x option: model states less the gradients while none exist
    parts: dict                  # the phase's breakdown (stage_memory)


def _main_phase(k: dict, opts: list[Variant], e: dict, in_flight: np.ndarray, chi: np.ndarray, grad_coeff: float,
                pp: int, tp: int, boundary: float, logits_per_rank: float, head_split: bool) -> _MainPhase:
    """The forward/backward phase; `grad_coeff`: a parameter's gradient bytes per parameter byte (sb.grad).

    forward/backward (main): model states, less the gradients while none exist yet (chi_s = 1 when the
        stage's first backward comes before its micro-batches run out, m <= k_s: a step starts with
        none; but never under DDP, whose gradient buckets live through the run), + k_s micro-batches of
        activations + the gradient arriving at the stage's output: on the last stage the logits and their
        gradient (2 x the largest output: the fp32 gradient of the log-probabilities and of the logits, both
        live in LogSoftmaxBackward; with the head split over
        the vocabulary 3 x the rank's shard, as torch's loss_parallel computes the gradient in one
        expression, (zeros_like(x) + exp(x)) * grad, holding three shards at once:
        torch/distributed/tensor/parallel/loss.py `_nll_loss_and_log_softmax_backward`, measured on
        the CPU allocator); elsewhere the gradient of the boundary activation (/ tp when
        sequence-sharded); + once gradients exist, a second gradient of the stage's largest parameter
        (computed whole, then accumulated into the one held) -- on the last stage not beside the loss's
        gradients but after them, beside the logits' gradient (the larger of the two moments).
    """
    arriving = np.full(pp, float(boundary))
    arriving[-1] = loss_gradient_bytes(logits_per_rank, head_split)
    # a weight's gradient is computed whole, then added to the one held: once gradients exist, the
    # stage's largest parameter has a second, transient gradient (first stage: the embedding; last: the
    # head; between: a layer's largest weight)
    per_stage_param = np.full(pp, float(k["layer"]))
    per_stage_param[0] = max(k["layer"], k["prefix"])
    per_stage_param[-1] = max(per_stage_param[-1], k["suffix"])
    accumulate = (1 - chi) * grad_coeff * per_stage_param / tp
    workspace = arriving + accumulate
    # on the last stage the loss's gradients and the head's second gradient are not live at once: the head's
    # backward runs after the loss's, holding the logits' gradient (at most the fp32 logits) beside it
    workspace[-1] = max(arriving[-1], logits_per_rank + accumulate[-1])
    main = e["state"] - chi * e["grad"] + in_flight * e["act"] + workspace
    states = np.array([o.state for o in opts] or [0.0])
    held = states[None, :] - chi[:, None] * np.array([o.grad for o in opts] or [0.0])[None, :]
    parts = {"model_states": e["state"] - chi * e["grad"], "activations": in_flight * e["act"], "state_coeff": held}
    return _MainPhase(pp, e, in_flight, chi, arriving, per_stage_param, workspace, main, states,
                      np.array([o.act for o in opts] or [0.0]), held, parts)


def _second_backward(mp: _MainPhase, grad_coeff: float, tp: int) -> MemoryPhase:
    """The next backward after the first has made every gradient.

    second backward (stages whose first backward comes before their micro-batches run out, chi_s = 1,
        with m >= 2 micro-batches): the first backward has made every gradient of the stage, and the next
        one runs with them, one micro-batch fewer in flight, its arriving gradient and the transient
        second gradient of the largest parameter -- above the main phase when a micro-batch's activations
        are fewer bytes than the stage's gradients (measured: a 4-stage pipeline's first stage).
    """
    e, fewer = mp.e, mp.in_flight - 1
    again = mp.chi * (mp.arriving + grad_coeff * mp.per_stage_param / tp)
    return MemoryPhase("second backward", mp.states[None, :] + fewer[:, None] * mp.act[None, :],
                       e["state"] + fewer * e["act"] + again,
                       parts={"model_states": e["state"], "activations": fewer * e["act"], "workspace": again})


def _rebuilt(o: Variant, b: int) -> float:
    """What re-running option o's layer holds: its "none" saved bytes less its policy's, and the weight copies
    its re-run saves (autocast's casts)."""
    return (o.base.saved_by_policy["none"] - o.base.saved_by_policy[o.recompute]) * b + o.base.weight_saved


def _largest_rebuild(opts: list[Variant], b: int) -> float:
    return max(_rebuilt(o, b) for o in opts if o.recompute != "none")


def _allocator_cache_phases(mp: _MainPhase, opts: list[Variant], b: int, device, cache: dict) -> list[MemoryPhase]:
    """One phase per recompute policy where `device` charges the allocator's cache: the re-run layer's blocks
    stay cached too; fills `cache` with each policy's largest re-run layer."""
    phases = []
    for policy in sorted({o.recompute for o in opts} - {"none"}):
        gate = np.array([o.recompute == policy for o in opts])
        cache[policy] = max(_rebuilt(o, b) for o, g in zip(opts, gate) if g)
        extra = device.allocator_cache_bytes(0.0, cache[policy]) if device is not None else 0.0
        if extra and device.charges_allocator_cache:
            phases.append(MemoryPhase(f"allocator cache beside {policy} recompute",
                                      mp.held + mp.in_flight[:, None] * mp.act[None, :], mp.main + extra,
                                      gate=gate, parts={**mp.parts, "workspace": mp.workspace}, reserved_only=True))
    return phases


def _recompute_phases(mp: _MainPhase, opts: list[Variant], b: int, ws: float, autocast: bool) -> list[MemoryPhase]:
    """The phases of recomputation; `ws`: the rebuild's workspace.

    rebuild (binds only on stages holding a recomputed layer): all model states + activations + the
        boundary gradient + one layer's re-run activations (its "none" saved bytes less its policy's, and
        the weight copies its re-run saves: autocast's casts).
    forward end, under autocast (binds only on stages holding a recomputed layer): autocast caches one
        bf16 cast of every weight for the whole forward of a micro-batch, so at its end the casts of the
        recomputed layers are live beside the activations of the micro-batches in flight, which keep
        their own layers' casts (strategies: `weight_saved`); no workspace yet (the loss comes after).
    """
    e, in_flight, pp = mp.e, mp.in_flight, mp.pp
    rec = np.array([o.recompute != "none" for o in opts] or [False])
    phases = [MemoryPhase("recompute", mp.states + in_flight[:, None] * mp.act[None, :],
                          e["state"] + in_flight * e["act"] + ws, gate=rec,
                          parts={"model_states": e["state"], "activations": in_flight * e["act"],
                                 "workspace": np.full(pp, ws)})]
    casts = np.array([o.base.weight_saved if o.recompute != "none" else 0.0 for o in opts])
    if autocast and casts.any():
        phases.append(MemoryPhase("forward end (autocast's weight casts)",
                                  mp.held + in_flight[:, None] * mp.act[None, :] + casts[None, :],
                                  mp.main - mp.workspace, gate=rec, parts={**mp.parts, "workspace": np.zeros(pp)}))
    return phases



def widest_product(graph) -> float:
    """The bytes per sample of the widest output a matrix multiplication of `graph` produces (the largest
    output of any operator where none is a linear layer): the transient the formulations without per-stage
    constants (the per-block program, heterogeneous groups) charge the allocator's cache for, on every
    stage."""
    g = graph.g
    linear = [d["out_bytes"] for _, d in g.nodes(data=True) if d["kind"] == "linear"]
    return float(max(linear or [d["out_bytes"] for _, d in g.nodes(data=True)] or [0]))


def allocator_transient(k: dict, b: int, pp: int, tp: int, head_split: bool) -> np.ndarray:
    """Each stage's largest transient, which the caching allocator keeps cached beside its peak
    (costmodel.hardware.ALLOCATOR_CACHE_FACTOR): the widest output of a layer's projections (/ tp, as tensor
    parallelism splits them), and on the last stage the head's output, the logits, if wider (/ tp where the
    head is split over the vocabulary). `k`: memory_phases' per-graph constants, per sample."""
    transient = np.full(pp, k["projection"] * b / tp)
    transient[-1] = max(transient[-1], k["head"] * b / (tp if head_split else 1))
    return transient


def stage_memory(c: Candidate, s: int, counts: np.ndarray | None = None) -> dict:
    """Stage s's predicted peak by category, at the phase where it peaks (memory_phases), for the
    candidate's solution or for `counts`."""
    prob, parts = c.problem, c.parts
    counts = c.solution.counts if counts is None else counts
    if c.formulation == "blocks":  # one phase: model states, activations in flight, a fixed workspace
        states = float(counts[s] @ prob.state + parts["e_state"][s])
        act = float(counts[s] @ (prob.act * prob.in_flight[s]) + prob.in_flight[s] * parts["e_act"][s])
        row = {k: int(round(v)) for k, v in (("model_states", states), ("activations", act),
                                              ("workspace", prob.workspace))}
        return {**row, "total": sum(row.values()), "phase": "forward/backward"}
    phases = phase_memory(prob, counts)[:, s]
    phases[1:][[q.reserved_only for q in prob.phases]] = -np.inf  # (bounds on the cache, not allocations)
    q = int(np.argmax(phases))
    total = float(phases[q])
    workspace = np.broadcast_to(parts["workspace"], (c.pp,))[s] if q == 0 else prob.phases[q - 1].parts["workspace"][s]
    state = per_stage(prob, prob.option_state)[s]
    if q == 0:
        act = float(counts[s] @ (per_stage(prob, prob.option_act)[s] * prob.in_flight[s])
                    + prob.in_flight[s] * parts["e_act"][s])
        states = total - act - workspace
    else:
        q_parts = prob.phases[q - 1].parts  # (a phase whose state is not every option's: its own coefficients)
        coeff = q_parts["state_coeff"][s] if "state_coeff" in q_parts else state
        states = float(counts[s] @ coeff + q_parts["model_states"][s])
        act = total - states - workspace
    row = {k: int(round(v)) for k, v in (("model_states", states), ("activations", act), ("workspace", workspace))}
    row["total"] = sum(row.values())
    row["phase"] = "forward/backward" if q == 0 else prob.phases[q - 1].name
    return row


def stage_host_memory(c: Candidate, s: int) -> int:
    """Bytes of host memory one rank of stage s holds for the candidate's solution: the model states its
    offloaded layers keep there (FSDP2's CPUOffloadPolicy) and the activations its offloaded layers move
    there, per micro-batch in flight -- the constraint the solver kept within Device.host_memory_bytes
    (planner.solve.milp.fits), and what runtime.launcher.sizes checks against the host a run starts on."""
    host = host_bytes_blocks if c.formulation == "blocks" else host_bytes
    return int(round(float(host(c.problem, c.solution.counts)[s])))
