"""Plan a GPT preset for a cluster from the Python API: print the report, save the plan, read it back.

    python examples/plan_gpt.py                                  # GPT-3 175B on 128 nodes of 8 A100-80GB
    python examples/plan_gpt.py --model megatron-39b --cluster 64x8xA100-80GB --global-batch 1536
    python examples/plan_gpt.py --model gpt:layers=24,hidden=2048,heads=16,seq=2048,vocab=51200 \\
        --cluster 4x8xH100-80GB --global-batch 512

Planning runs on fake tensors, so any size plans on a laptop. `partita models` lists the presets; the
same plan from the command line: `partita plan --model gpt3-175b --cluster 128x8xA100-80GB
--global-batch 1536 --seq 2048 --out plan.json`.
"""
from __future__ import annotations

import argparse

import partita


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt3-175b", help="a preset (partita models) or gpt:layers=..,hidden=..")
    ap.add_argument("--cluster", default="128x8xA100-80GB", help="nodes x devices x device, e.g. 16x8xH100-80GB")
    ap.add_argument("--global-batch", type=int, default=1536, help="samples per optimizer step")
    ap.add_argument("--seq", type=int, default=2048, help="tokens per sample")
    ap.add_argument("--out", default="plan.json", help="where to save the plan")
    args = ap.parse_args(argv)

    train = partita.TrainConfig(global_batch=args.global_batch, seq_len=args.seq)  # Adam; bf16 on GPUs, fp32 on CPUs by default
    plan = partita.plan(args.model, cluster=args.cluster, train=train)
    print(plan.explain())

    plan.save(args.out)
    again = partita.Plan.load(args.out)  # validated on load; JSON only, nothing is executed
    assert again.to_dict() == plan.to_dict()

    # the keys scripts may rely on (DESIGN.md): mesh, schedule, predicted, solver
    m, s, p = plan.mesh, plan.schedule, plan.predicted
    print(f"\nsaved {args.out}: mesh pp={m.pp} dp={m.dp} tp={m.tp}, {s.name} with {s.num_microbatches} "
          f"micro-batches of {s.micro_batch_size}; predicted {p['step_time_s']:.3g} s per step, "
          f"{p['tflops_per_device']:.0f} TFLOP/s per device (MFU {p['mfu']:.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
