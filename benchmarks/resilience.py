"""What failures and lost nodes cost a 16k-GPU job, at Llama 3's published failure rate (issue 41).

Llama 3 405B was pre-trained on 16,384 H100s and saw 419 unexpected interruptions in 54 days (Dubey et al. 2024,
section 3.3.4): one every 3.09 hours. This plans llama3-405b on 2,048 nodes of 8 H100-80GB at Llama 3's batch
(2,048 sequences of 8,192 tokens) for every size from MIN to 2,048 nodes (`partita plan --nnodes`), with that
failure rate (`--mtbf`), and records each size's plan, relative throughput, checkpoint interval and expected time
lost, with the assumptions the figures rest on.

    python -m benchmarks.resilience     # writes benchmarks/results/resilience.json (a few minutes: one search per size)
"""
from __future__ import annotations

import argparse
import sys
import time

from benchmarks.common import write

MODEL, CLUSTER, GLOBAL_BATCH, SEQ = "llama3-405b", "2048x8xH100-80GB", 2048, 8192
MIN_NODES = 1920


def mtbf_hours() -> float:
    from partita.planner.estimate.resilience import HOUR, LLAMA3_INTERRUPTIONS
    count, seconds, _ = LLAMA3_INTERRUPTIONS
    return seconds / count / HOUR


def measure(min_nodes: int = MIN_NODES) -> dict:
    from partita.planner.api import plan_set
    from partita.planner.search import TrainConfig
    t0 = time.perf_counter()
    s = plan_set(MODEL, cluster=CLUSTER, train=TrainConfig(global_batch=GLOBAL_BATCH, seq_len=SEQ),
                 nnodes=(min_nodes, 2048), mtbf_h=mtbf_hours())
    wall = time.perf_counter() - t0
    print(s.table(), flush=True)
    return {"model": MODEL, "cluster": CLUSTER, "global_batch": GLOBAL_BATCH, "seq_len": SEQ,
            "mtbf_h": mtbf_hours(), "source": "Dubey et al. 2024, The Llama 3 Herd of Models, section 3.3.4",
            "wall_time_s": wall, "summary": s.summary(),
            "command": f"partita plan --model {MODEL} --cluster {CLUSTER} --global-batch {GLOBAL_BATCH} --seq {SEQ} "
                       f"--nnodes {min_nodes}:2048 --mtbf {mtbf_hours():.3g}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.resilience", description=__doc__.split("\n")[0])
    ap.add_argument("--min-nodes", type=int, default=MIN_NODES)
    args = ap.parse_args(argv)
    print(f"wrote {write('resilience', measure(args.min_nodes))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
