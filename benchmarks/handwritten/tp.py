"""Hand-written tensor parallelism (Megatron style) with DTensor's parallelize_module on every rank:
q, k, v and fc1 column-parallel, proj and fc2 row-parallel; embeddings, norms and the head replicated."""
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from benchmarks.handwritten.loop import finish, parse_args, setup, train


def main():
    args = parse_args()
    spec, model = setup(args)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        parallelize_module(block, mesh, {
            "attn.q": ColwiseParallel(), "attn.k": ColwiseParallel(), "attn.v": ColwiseParallel(),
            "attn.proj": RowwiseParallel(), "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel()})
    train(args, spec, model, 0, 1)  # every rank trains the whole batch


if __name__ == "__main__":
    main()
    finish()
