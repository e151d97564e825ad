"""Resharding costs against DTensor's own redistribute on a fake process group (shapes and bytes only).

The fake process group moves no data, so these tests check which collectives DTensor issues, in which
order, over which group size and on which local tensor shapes, against costmodel.price.reshard; the numbers
(times) are checked by hand-computed formulas.
"""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.distributed_c10d import _resolve_process_group
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.distributed.fake_pg import FakeStore
from torch.utils._python_dispatch import TorchDispatchMode

from partita.costmodel.price import comm
from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.price.reshard import P, R, S, local_shape, placement, reshard

WORLD = 8


@pytest.fixture(scope="module", autouse=True)
def fake_world():
    if dist.is_initialized():  # pragma: no cover - another test left a group behind
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
    yield
    dist.destroy_process_group()


_KINDS = {"all_gather_into_tensor": "all_gather", "all_reduce": "all_reduce",
          "reduce_scatter_tensor": "reduce_scatter", "shard_dim_alltoall": "all_to_all"}


class Collectives(TorchDispatchMode):
    """Records (kind, group size, input shape) of each collective DTensor issues."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._overloadpacket.__name__
        if name in _KINDS:
            group_name = next(a for a in reversed(args) if isinstance(a, str))
            size = _resolve_process_group(group_name).size()
            self.seen.append((_KINDS[name], size, tuple(args[0].shape)))
        return out


def _dtensor_placement(p):
    return {"R": Replicate(), "P": Partial()}.get(p.kind) or Shard(p.dim)


def _redistribute(device_type, mesh_shape, global_shape, src, dst):
    mesh = init_device_mesh(device_type, mesh_shape)
    src_p = [_dtensor_placement(p) for p in src]
    dst_p = [_dtensor_placement(p) for p in dst]
    local = torch.empty(local_shape(global_shape, src, mesh_shape), device="meta" if device_type == "meta" else "cpu")
    x = DTensor.from_local(local, mesh, src_p, shape=global_shape,
                           stride=torch.empty(global_shape, device="meta").stride())
    with CommDebugMode() as counts, Collectives() as rec:
        y = x.redistribute(mesh, dst_p)
    kinds = {}
    for op, c in counts.get_comm_counts().items():
        k = _KINDS[op.__name__]
        kinds[k] = kinds.get(k, 0) + c
    return kinds, rec.seen, tuple(y.to_local().shape)


CASES_1D = [(S(0), R), (P, R), (P, S(0)), (P, S(1)), (S(1), S(0)), (S(0), S(1)), (R, S(0)), (S(0), S(0))]
CASES_2D = [
    ((S(0), S(1)), (S(1), S(0))),
    ((P, P), (S(0), S(1))),
    ((P, P), (R, R)),
    ((S(0), S(0)), (R, S(0))),
    ((S(0), S(0)), (S(0), R)),
    ((P, S(0)), (R, R)),
    ((S(0), R), (R, S(1))),
    ((P, R), (S(0), S(1))),
    ((R, P), (S(1), R)),
    ((S(1), P), (S(1), S(1))),
    ((R, S(0)), (S(0), R)),
]


def _check(device_type, mesh_shape, global_shape, src, dst, alltoall):
    kinds, seen, out_shape = _redistribute(device_type, mesh_shape, global_shape, src, dst)
    r = reshard(global_shape, src, dst, mesh_shape, itemsize=4, alltoall=alltoall)
    model = [(s.collective, s.group_size, s.input_shape) for s in r.steps if s.collective != "local"]
    assert dict(r.collectives) == kinds
    # all-to-all is one custom op whose input DTensor pads; all others: the exact input tensor
    assert [(k, n, int(torch.Size(shape).numel())) for k, n, shape in model] == \
           [(k, n, int(torch.Size(shape).numel())) for k, n, shape in seen]
    final = r.steps[-1].output_shape if r.steps else local_shape(global_shape, src, mesh_shape)
    assert final == out_shape == local_shape(global_shape, dst, mesh_shape)
    for s in r.steps:
        nbytes = torch.Size(s.input_shape).numel() * 4
        n = s.group_size
        expected = {"all_gather": (nbytes, (n - 1) * nbytes), "all_reduce": (2 * (n - 1) / n * nbytes,) * 2,
                    "reduce_scatter": ((n - 1) / n * nbytes,) * 2, "all_to_all": ((n - 1) / n * nbytes,) * 2,
                    "local": (0, 0)}[s.collective]
        assert (s.send_bytes, s.recv_bytes) == pytest.approx(expected)


@pytest.mark.parametrize("src,dst", CASES_1D, ids=lambda p: str(p))
@pytest.mark.parametrize("global_shape", [(16, 12), (10, 7)], ids=["even", "uneven"])
def test_1d_mesh_matches_dtensor(src, dst, global_shape):
    _check("meta", (4,), global_shape, [src], [dst], alltoall=True)


@pytest.mark.parametrize("src,dst", CASES_2D, ids=lambda ps: ",".join(map(str, ps)))
@pytest.mark.parametrize("global_shape", [(16, 24), (10, 14)], ids=["even", "uneven"])
def test_2d_mesh_matches_dtensor(src, dst, global_shape):
    _check("meta", (2, 4), global_shape, list(src), list(dst), alltoall=True)


@pytest.mark.parametrize("src,dst", [((S(0), S(1)), (S(1), S(0))), ((S(0), R), (S(1), R))],
                         ids=["nested", "simple"])
def test_cpu_mesh_gathers_instead_of_all_to_all(src, dst):
    """DTensor on a CPU mesh (gloo) replaces all-to-all by all-gather + chunk: alltoall=False."""
    _check("cpu", (2, 4), (16, 24), list(src), list(dst), alltoall=False)


def test_named_conversions_and_bytes():
    shape, mesh = (1024, 512), (8,)
    full = 1024 * 512 * 2
    ag = reshard(shape, ["S(0)"], ["R"], mesh, itemsize=2)
    assert [s.collective for s in ag.steps] == ["all_gather"]
    assert (ag.send_bytes, ag.recv_bytes) == (full / 8, 7 * full / 8)
    ar = reshard(shape, ["Partial(sum)"], ["Replicate()"], mesh, itemsize=2)
    assert ar.steps[0].collective == "all_reduce" and ar.send_bytes == pytest.approx(2 * 7 / 8 * full)
    rs = reshard(shape, ["P"], ["Shard(1)"], mesh, itemsize=2)
    assert rs.steps[0].collective == "reduce_scatter" and rs.recv_bytes == pytest.approx(7 / 8 * full)
    a2a = reshard(shape, ["S(0)"], ["S(1)"], mesh, itemsize=2)
    assert a2a.steps[0].collective == "all_to_all" and a2a.send_bytes == pytest.approx(7 / 8 * full / 8)
    free = reshard(shape, ["R"], ["S(0)"], mesh, itemsize=2)
    assert free.send_bytes == free.recv_bytes == free.time_s == 0 and not free.collectives
    # S -> P is not a DTensor step; modelled as all-gather then local
    sp = reshard(shape, ["S(0)"], ["P"], mesh, itemsize=2)
    assert [s.collective for s in sp.steps] == ["all_gather", "local"]


def test_times_use_the_mesh_axis_group():
    c = parse_cluster("2x8xA100-80GB")
    d = c.device
    shape, mesh = (4096, 4096), (2, 8)  # axis 0 crosses nodes (stride 8), axis 1 inside a node
    inside = reshard(shape, [R, P], [R, R], mesh, itemsize=2, cluster=c)
    b = 4096 * 4096 * 2
    assert inside.time_s == pytest.approx(2 * 7 * d.intra_node_latency + 2 * 7 / 8 * b / comm.beta_intra(d))
    across = reshard(shape, [P, R], [R, R], mesh, itemsize=2, cluster=c)
    assert across.time_s == pytest.approx(2 * d.inter_node_latency + b / comm.beta_inter(c))
    gather = reshard(shape, [R, S(0)], [R, R], mesh, itemsize=2, cluster=c)
    assert gather.time_s == pytest.approx(comm.all_gather(c, comm.group_for(c, 8, 1), b))
    assert gather.time_s == pytest.approx(7 * d.intra_node_latency + 7 / 8 * b / comm.beta_intra(d))


@pytest.mark.parametrize("bad,needle", [
    ("Q", "placement 'Q' not understood"),
    ("Shard(x)", "not understood"),
])
def test_bad_placements(bad, needle):
    with pytest.raises(PartitaError, match=needle):
        placement(bad)


def test_bad_requests():
    with pytest.raises(PartitaError, match="one entry per mesh axis"):
        reshard((4, 4), [R], [R, R], (2, 2))
    with pytest.raises(PartitaError, match="names dim 2 of a 2-d tensor"):
        reshard((4, 4), [S(2)], [R], (2,))
    with pytest.raises(PartitaError, match="partial reduction"):
        reshard((4, 4), ["P(sum)"], ["P(max)"], (2,))
