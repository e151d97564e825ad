"""What failures cost a run, and how often it should checkpoint (Young 1974; Daly 2006).

Symbols, all in seconds:

    M   the job's mean time between interruptions (failures are a Poisson process of rate 1/M)
    d   how long one checkpoint save stalls training (delta in the papers)
    R   from a failure to training again: detection, restart, rendezvous, reading the checkpoint back
    t   training time between two saves (tau)

Daly's model ("A higher order estimate of the optimum checkpoint interval for restart dumps", Future Generation
Computer Systems 22, 2006): a failure may strike while computing, saving or restarting, and the work since
the last save is redone. The expected wall time of T_s seconds of training is

    T_w(t) = M e^(R/M) (e^((t + d)/M) - 1) T_s / t

and the fraction of the job's time that failures and saves take is 1 - T_s / T_w. Its minimum over t is close to

    t* = sqrt(2 d M) [1 + sqrt(d / (2M)) / 3 + (d / (2M)) / 9] - d      for d < 2M, else t* = M      (Daly)

whose first term alone is Young's first-order optimum sqrt(2 d M) ("A first order approximation to the optimum
checkpoint interval", CACM 17, 1974). tests/planner/test_resilience.py checks t* against the numerical minimum of
T_w and the lost fraction against a simulation of Poisson failures.

Snapshots in the nodes' memory (`partita run --snapshot-every`, runtime.checkpoint.snapshot) are a second level
priced with the same model. A snapshot holds each byte of the state once (replicas cut into pieces among their
holders), so a rank copies B_w = the checkpoint's bytes / world size, once, from the device straight into the pages
of its file in the node's tmpfs, at b_s = min(host_bw, snapshot_bw): its host link, or what a process writes into
fresh tmpfs pages (`--snapshot-bandwidth`; an assumption, said with the figures, which `python -m
benchmarks.snapshots` measures on the machine it runs on). On several nodes each node's B_w x devices_per_node bytes
also go to the next node (the ring). A snapshot's copy takes d_m = B_w / b_s + B_w x devices_per_node /
node_bw. Recovery is R_m = the same fixed restart + B_r x devices_per_node / node_bw (every rank's whole shard of
the new plan, B_r, gathered from the nodes that hold its pieces) + B_r / host_bw (back to the device). The copy runs
in a thread beside the next step's forward and backward, which waits for it only before its optimizer step: the
stall is what the copy takes beyond a step, max(0, d_m - step time) (the step's own optimizer update taken as part
of the window, and the copy's share of the host's memory bandwidth left out: both favour the snapshot slightly). Daly's optimum over d_m gives the
snapshot interval, and his T_w the time lost -- for the failures that leave a copy of every shard on a node still
up (one node lost, or a worker on a node that lives); a failure of a node and the one keeping its copy together
resumes from disk, whose interval is priced above.

The save and the read-back are priced from the checkpoint's bytes -- every parameter's weights and optimizer state
once (DCP writes each shard once, replicas deduplicated), all nodes writing in parallel -- over a storage bandwidth
per node the user states (`--checkpoint-bandwidth`; the default is an assumption, and said so).
"""
from __future__ import annotations

import math
from dataclasses import replace

from partita.costmodel.errors import PartitaError
from partita.costmodel.price.memory import state_bytes
from partita.planner.plan.resilience import HOUR, Resilience, Snapshots

DEFAULT_STORAGE_BW = 2e9
"""Bytes/s one node writes (and reads) a checkpoint at, when the user states none: an assumption (a shared
file system's share per node), printed with every figure it produces."""
DEFAULT_RESTART_S = 60.0
"""Seconds from a failure to the workers rendezvoused again, before the checkpoint is read: an assumption
(detection, the agents' restart, process start and imports), printed with every figure it produces."""
DEFAULT_SNAPSHOT_BW = 5e9
"""Bytes/s one rank writes a snapshot into fresh pages of its node's tmpfs, when the user states none: an assumption
(a server's memory, shared by the node's ranks, and the page faults of new pages), printed with every figure it
produces; `python -m benchmarks.snapshots` measures it on the machine it runs on."""
LLAMA3_INTERRUPTIONS = (419, 54 * 24 * HOUR, 16384)
"""Llama 3's pre-training: 419 unexpected interruptions in 54 days on 16,384 H100s (Dubey et al. 2024,
"The Llama 3 Herd of Models", section 3.3.4): a job MTBF of 3.09 hours at that size."""


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's higher-order optimum of the training time between saves (module docstring)."""
    _check_positive(save_s=save_s, mtbf_s=mtbf_s)
    if save_s >= 2 * mtbf_s:
        return mtbf_s
    x = save_s / (2 * mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s) * (1 + math.sqrt(x) / 3 + x / 9) - save_s


def young_interval(save_s: float, mtbf_s: float) -> float:
    """Young's first-order optimum sqrt(2 d M)."""
    _check_positive(save_s=save_s, mtbf_s=mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s)


def wall_per_work(interval_s: float, save_s: float, restart_s: float, mtbf_s: float) -> float:
    """T_w / T_s under Daly's model: wall seconds per second of training (module docstring)."""
    _check_positive(interval_s=interval_s, mtbf_s=mtbf_s)
    return mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + save_s) / mtbf_s) / interval_s


def lost_fraction(interval_s: float, save_s: float, restart_s: float, mtbf_s: float) -> float:
    """The expected fraction of the job's wall time spent saving, restarting and redoing lost work."""
    return 1.0 - 1.0 / wall_per_work(interval_s, save_s, restart_s, mtbf_s)


def checkpoint_bytes(parameters: int, dtype: str, optimizer: str, master_weights: str = "fp32") -> float:
    """Bytes of one checkpoint of `parameters` parameters: each one's weights and optimizer state once."""
    s = state_bytes(dtype, optimizer, master_weights=master_weights)
    return float(parameters) * (s.param + s.optimizer)


def price(*, parameters: int, dtype: str, optimizer: str, master_weights: str, nodes: int, step_s: float,
          mtbf_s: float, storage_bw: float | None = None, restart_s: float | None = None) -> Resilience:
    """The checkpoint interval and expected lost time of a plan of `parameters` parameters on `nodes` nodes whose
    step takes `step_s`, for a job that is interrupted once every `mtbf_s` on average."""
    _check_positive(nodes=nodes, step_s=step_s, mtbf_s=mtbf_s)
    bw = DEFAULT_STORAGE_BW if storage_bw is None else storage_bw
    fixed = DEFAULT_RESTART_S if restart_s is None else restart_s
    _check_positive(storage_bw=bw)
    if fixed < 0:
        raise PartitaError(f"the restart time must be at least 0 s, got {fixed:g}")
    size = checkpoint_bytes(parameters, dtype, optimizer, master_weights)
    save = size / (bw * nodes)
    restart = fixed + save  # the read-back at the write bandwidth
    interval = daly_interval(save, mtbf_s)
    every = max(1, round(interval / step_s))
    assumed = []
    if storage_bw is None:
        assumed.append(f"checkpoint storage at {bw / 1e9:g} GB/s per node, writing and reading (assumed; "
                       "--checkpoint-bandwidth)")
    if restart_s is None:
        assumed.append(f"{fixed:g} s from a failure to the workers started again, before the checkpoint is read "
                       "(assumed; --restart-seconds)")
    return Resilience(mtbf_s=mtbf_s, checkpoint_bytes=size, save_s=save, restart_s=restart, interval_s=interval,
                      every_steps=every, lost_fraction=lost_fraction(every * step_s, save, restart, mtbf_s),
                      assumptions=tuple(assumed))


def _check_positive(**values: float) -> None:
    for name, v in values.items():
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            raise PartitaError(f"{name.replace('_', ' ')} must be a positive number, got {v!r}")


def price_plan(plan, *, nodes: int, mtbf_s: float, storage_bw: float | None = None,
               restart_s: float | None = None, cluster=None, snapshot_bw: float | None = None) -> Resilience:
    """`price` for a plan (planner.plan.Plan) on `nodes` nodes: its parameters, training states and predicted step;
    with its `cluster` (costmodel.hardware.Cluster), the snapshots in memory too (`price_snapshots`)."""
    t = plan.train
    out = price(parameters=plan.model["parameters"], dtype=t["dtype"], optimizer=t["optimizer"],
                master_weights=t.get("master_weights", "fp32"), nodes=nodes, step_s=plan.predicted["step_time_s"],
                mtbf_s=mtbf_s, storage_bw=storage_bw, restart_s=restart_s)
    if cluster is None:
        return out
    d = cluster.device
    snaps = price_snapshots(written=out.checkpoint_bytes / plan.mesh.world_size, shard=rank_state_bytes(plan),
                            devices_per_node=cluster.devices_per_node, ring=nodes > 1, host_bw=d.host_bw,
                            snapshot_bw=DEFAULT_SNAPSHOT_BW if snapshot_bw is None else snapshot_bw,
                            node_bw=d.inter_node_bw * d.inter_link_efficiency * cluster.devices_per_node,
                            step_s=plan.predicted["step_time_s"], mtbf_s=mtbf_s,
                            restart_s=DEFAULT_RESTART_S if restart_s is None else restart_s)
    assumed = () if snapshot_bw is not None else (
        f"snapshots written into the node's memory at {DEFAULT_SNAPSHOT_BW / 1e9:g} GB/s per rank (assumed; "
        "--snapshot-bandwidth)",)
    return replace(out, snapshots=snaps, assumptions=out.assumptions + assumed)


def rank_state_bytes(plan) -> float:
    """Weights and optimizer state one rank of a dense plan holds: the weights split over pp x tp (and dp under
    ZeRO-3), the optimizer state over pp x tp (and dp under ZeRO-1 and up)."""
    t, m = plan.train, plan.mesh
    s = state_bytes(t["dtype"], t["optimizer"], master_weights=t.get("master_weights", "fp32"))
    n, split = float(plan.model["parameters"]), m.pp * m.tp
    return n * s.param / (split * (m.dp if plan.zero_stage >= 3 else 1)) + \
        n * s.optimizer / (split * (m.dp if plan.zero_stage >= 1 else 1))


def price_snapshots(*, written: float, shard: float, devices_per_node: int, ring: bool, host_bw: float,
                    snapshot_bw: float, node_bw: float, step_s: float, mtbf_s: float, restart_s: float) -> Snapshots:
    """The snapshot interval and the time lost with snapshots in memory (module docstring): a rank writes `written`
    bytes a snapshot and loads its `shard` bytes back in a recovery."""
    _check_positive(host_bw=host_bw, snapshot_bw=snapshot_bw, node_bw=node_bw, step_s=step_s, mtbf_s=mtbf_s)
    copy = written / min(host_bw, snapshot_bw) + (written * devices_per_node / node_bw if ring else 0.0)
    stall = max(0.0, copy - step_s)  # beside the next step, which waits for it only before its optimizer step
    recover = restart_s + shard * devices_per_node / node_bw + shard / host_bw
    interval = daly_interval(stall, mtbf_s) if stall > 0 else step_s
    every = max(1, round(interval / step_s))
    return Snapshots(rank_bytes=written, ring=ring, copy_s=copy, snapshot_s=stall, recover_s=recover,
                     interval_s=interval, every_steps=every,
                     lost_fraction=lost_fraction(every * step_s, stall, recover, mtbf_s))
