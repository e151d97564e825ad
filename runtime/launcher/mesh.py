"""Process group, device and the (pp, dp, cp, tp) DeviceMesh of a plan.

The backend and device follow `torch.cuda.is_available()` (NCCL on GPU, gloo on CPU), never a flag.
Ranks are laid out pp-major, then dp, then cp, then tp (tp fastest), as `Plan.mesh.coords(rank)` says.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from partita.costmodel import PartitaError
from partita.planner.plan import Plan
from partita.runtime.loop.allocator import configure_allocator

DIMS = ("pp", "dp", "cp", "tp")


def env_world() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from the torchrun environment; (0, 0, 1) outside torchrun."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
            int(os.environ.get("WORLD_SIZE", 1)))


def select_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        configure_allocator(cuda=True)  # before CUDA initialises its allocator (runtime.loop.allocator)
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


@dataclass
class Topology:
    """This rank's place in the plan's mesh."""

    mesh: DeviceMesh
    rank: int
    pp: int
    dp: int
    tp: int
    pp_rank: int
    dp_rank: int
    tp_rank: int
    device: torch.device
    cp: int = 1
    cp_rank: int = 0

    def group(self, dim: str):
        return self.mesh.get_group(dim)


def _store(rank: int, world: int):
    """The store for the default process group, or None for init_process_group's own env:// rendezvous.

    - one process without torchrun (no MASTER_ADDR): an in-memory store;
    - a torchrun restart on the agent's shared TCPStore (TORCHELASTIC_USE_AGENT_STORE=True, torch's
      default since 2.5): the store outlives the attempts, and the previous attempt's keys (gloo/NCCL
      addresses) would be read as this attempt's, so ranks connect to dead peers (pytorch#135712). Keys
      are prefixed by the restart count, which torchrun gives every worker of a node alike. Multi-node
      elastic jobs need TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (a fresh store per attempt; partita's
      launchers set it, and `agree_on_attempt` refuses to start without it) since restart counts may
      differ between nodes.
    """
    if world == 1 and "MASTER_ADDR" not in os.environ:
        return dist.HashStore()
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is not None and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        store, _, _ = next(dist.rendezvous("env://", rank, world))
        return dist.PrefixStore(f"partita/attempt_{attempt}", store)
    return None


def agree_on_attempt() -> None:
    """Multi-node jobs: make TORCHELASTIC_RESTART_COUNT the same on every rank (the largest); an elastic job's
    rendezvous round counts (runtime.launcher.elastic.attempt_from_round).

    torchrun's agents count restarts per node: a node whose workers failed counts one, a node restarted
    only because another node re-joined the rendezvous does not. Whether an attempt resumes from a
    checkpoint (runtime.loop.session) and whether an injected fault fires (runtime.failure.faults) follow this count,
    so every rank must read the same value. One all-reduce on the default group, which this initialises,
    on every rank of a multi-node job whatever its own --max-restarts says (a node started with other flags
    than its peers must still reach runtime.launcher.agreement's check, not a collective its peers never call). A
    no-op on one node."""
    from partita.runtime.launcher.elastic import attempt_from_round
    world = env_world()[2]
    # an elastic job's later rounds continue too, also those torchrun does not count (runtime.launcher.elastic)
    local = max(int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0), attempt_from_round())
    if "TORCHELASTIC_RESTART_COUNT" in os.environ or local:
        os.environ["TORCHELASTIC_RESTART_COUNT"] = str(local)
    if int(os.environ.get("LOCAL_WORLD_SIZE", world)) == world:
        return
    device = init_default()
    count = torch.tensor([int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(int(count.item()))
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0) and \
            os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        raise PartitaError("restarts across nodes need a fresh rendezvous store per attempt: set "
                           "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 on every node (partita run does)")


def init_default() -> torch.device:
    """Initialise the default process group (once) from the torchrun environment; returns this rank's
    device. A single process started without torchrun (no MASTER_ADDR) gets a one-rank group on an
    in-memory store."""
    rank, local_rank, world = env_world()
    device = select_device(local_rank)
    if not dist.is_initialized():
        kw = {"device_id": device} if device.type == "cuda" else {}
        store = _store(rank, world)
        if store is not None:
            kw["store"] = store
        dist.init_process_group(backend_for(device), rank=rank, world_size=world, **kw)
    return device


def _text_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def broadcast_text(text: str | None) -> str:
    """Rank 0's text on every rank, as UTF-8 bytes in two tensor broadcasts (no pickle)."""
    device = _text_device()
    raw = text.encode() if text is not None else b""
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8).to(device) if raw else \
        torch.empty(0, dtype=torch.uint8, device=device)
    n = torch.tensor([data.numel()], dtype=torch.long, device=device)
    dist.broadcast(n, src=0)
    if data.numel() != n.item():
        data = torch.empty(int(n.item()), dtype=torch.uint8, device=device)
    dist.broadcast(data, src=0)
    return data.cpu().numpy().tobytes().decode()


def first_said(text: str | None) -> tuple[int, str] | None:
    """Collective on the default group: (rank, text) of the lowest rank that passes a text, None when no rank
    does. How ranks that each decided alone (a check of a shared directory, their own environment) end
    alike: one rank ending while its peers go on would leave them waiting in their next collective."""
    for rank, said in enumerate(gather_text(text or "")):
        if said:
            return rank, said
    return None


def gather_text(text: str) -> list[str]:
    """Every rank's text on every rank, in rank order (two all-gathers of UTF-8 bytes; no pickle)."""
    device, world = _text_device(), dist.get_world_size()
    raw = text.encode()
    sizes = [torch.zeros(1, dtype=torch.long, device=device) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([len(raw)], dtype=torch.long, device=device))
    longest = max(int(s.item()) for s in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8, device=device)
    if raw:
        mine[:len(raw)] = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    parts = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)]
    dist.all_gather(parts, mine)
    return [p[:int(s.item())].cpu().numpy().tobytes().decode() for p, s in zip(parts, sizes)]


def teardown(ok: bool = True) -> None:
    """Destroy the default process group (if any). After a run that ended normally on this rank, gloo ranks
    first wait for each other: a rank that closes its connections while a peer still finishes the last
    collective over them aborts that peer (SIGABRT). Not after an error: the peers may be gone or stuck
    elsewhere; a peer already gone makes the barrier fail at once, and that is ignored."""
    if not dist.is_initialized():
        return
    if ok and dist.get_backend() == "gloo":
        try:
            dist.barrier()
        except Exception:  # noqa: BLE001 -- a peer that ended with an error: nothing left to protect
            pass
    dist.destroy_process_group()


def init(plan: Plan) -> Topology:
    """Initialise the default process group (if needed) and build the plan's mesh. Call on every rank."""
    rank = env_world()[0]
    device = init_default()
    m = plan.mesh
    mesh = init_device_mesh(device.type, (m.pp, m.dp, m.cp, m.tp), mesh_dim_names=DIMS)
    coords = tuple(mesh.get_local_rank(d) for d in DIMS)
    assert coords == m.coords(rank), f"mesh layout {coords} != plan layout {m.coords(rank)} on rank {rank}"
    return Topology(mesh=mesh, rank=rank, pp=m.pp, dp=m.dp, tp=m.tp, pp_rank=coords[0], dp_rank=coords[1],
                    tp_rank=coords[3], device=device, cp=m.cp, cp_rank=coords[2])
