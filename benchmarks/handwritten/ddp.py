"""Hand-written data parallelism: torch DistributedDataParallel over every rank."""
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from benchmarks.handwritten.loop import finish, parse_args, setup, train


def main():
    args = parse_args()
    spec, model = setup(args)
    train(args, spec, DDP(model), dist.get_rank(), dist.get_world_size())


if __name__ == "__main__":
    main()
    finish()
