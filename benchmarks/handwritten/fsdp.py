"""Hand-written ZeRO-3: FSDP2 `fully_shard` on each transformer block, then on the whole model."""
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from benchmarks.handwritten.loop import finish, parse_args, setup, train


def main():
    args = parse_args()
    spec, model = setup(args)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    train(args, spec, model, dist.get_rank(), dist.get_world_size())


if __name__ == "__main__":
    main()
    finish()
