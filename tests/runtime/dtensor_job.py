"""A pool job (tests/rank_pool.py) that runs DTensor ops on a 2-rank mesh: `dtensor_job.py OUT EXTRA_GROUPS`.
It first makes EXTRA_GROUPS process groups (so the mesh's groups get later names), then shards a tensor,
gathers it back and writes, from rank 0, how many entries torch.distributed's caches held when the job began and
the gathered tensor's sum."""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from rank_pool import distributed_caches

out, extra = sys.argv[1], int(sys.argv[2])
cached = sum(c.cache_info().currsize for c in distributed_caches())
dist.init_process_group("gloo")
for _ in range(extra):
    dist.new_group([0, 1])
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
x = distribute_tensor(torch.arange(8.0), mesh, [Shard(0)])
y = (x * 2).redistribute(mesh, [Replicate()]).full_tensor()
if dist.get_rank() == 0:
    with open(out, "w") as f:
        json.dump({"cached_at_start": cached, "sum": float(y.sum())}, f)
dist.barrier()
dist.destroy_process_group()
