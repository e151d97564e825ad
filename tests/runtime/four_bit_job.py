"""A rank of test_four_bit.py's exchange (tests/rank_pool.py runs it as __main__ on each rank): it joins the default
gloo group, takes the mean of one vector per length across every rank with runtime.loop.sync.four_bit.FourBitMean, and
writes each mean (and its own vectors) to OUT.rank<r>.pt.

    four_bit_job.py OUT LENGTH [LENGTH ...]
"""
import sys

import torch
import torch.distributed as dist

from partita.runtime.loop.sync.four_bit import FourBitMean


def vector(rank: int, n: int) -> torch.Tensor:
    """Rank `rank`'s vector of `n` elements: seeded normals at a scale that differs by rank, with a run of zeros."""
    g = torch.Generator().manual_seed(1000 * rank + n)
    x = torch.randn(n, generator=g) * (1 + rank)
    x[: min(n, 70)] = 0.0  # a whole block of zeros, and one block that is part zeros
    return x


def main(argv: list[str]) -> None:
    out, lengths = argv[0], [int(a) for a in argv[1:]]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    try:
        inputs = [vector(rank, n) for n in lengths]
        wires = [x.clone() for x in inputs]
        pending = [FourBitMean(w, dist.group.WORLD) for w in wires]  # every phase 1 in flight at once
        for p in pending:
            p.wait()
        torch.save({"inputs": inputs, "means": wires}, f"{out}.rank{rank}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
