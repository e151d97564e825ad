import pytest
import torch
import torch.distributed as dist


@pytest.fixture
def topo():
    """A Topology on a fake process group (rank 0 of dp x tp): real meshes, no real communication."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from partita.runtime.launcher.mesh import Topology

    def make(dp, tp):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=dp * tp)
        mesh = init_device_mesh("cpu", (1, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        return Topology(mesh=mesh, rank=0, pp=1, dp=dp, tp=tp, pp_rank=0, dp_rank=0, tp_rank=0,
                        device=torch.device("cpu"))
    yield make
    if dist.is_initialized():
        dist.destroy_process_group()
