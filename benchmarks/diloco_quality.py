"""DiLoCo and streaming DiLoCo against synchronous data parallelism at equal tokens, on a tiny language model
(issue 42, item 4).

Two data-parallel replicas of tiny-gpt on gloo (each replica its own island), Adam inside (lr 3e-3), global batch
16 x 32 tokens (tiny-gpt's sequence), trained on a token stream a model can learn only in part: the next token is
(3 x this + 1) mod 64 with probability 0.8, else uniform over 64 ids (so the best loss is about 1.31 nats, not 0). Each run is
evaluated on the same held-out stream (16 batches) every 64 steps. Synchronous training, DiLoCo with H = 8 and
H = 32 (the published outer step: Nesterov SGD, lr 0.7, momentum 0.9; Douillard et al. 2023), streaming DiLoCo
at the same H (2 and 4 fragments, each all-reduce overlapped with one inner step, merged with alpha 0.5; Douillard
et al. 2025), both at H = 8 again with the outer change sent in 4 bits (runtime.loop.sync.four_bit), and local SGD
at H = 8 and 32 (`localsgd`: DiLoCo's outer step with lr 1 and no momentum, the replicas' mean, as model averaging
and FedAvg take it), seed 0, the same batches in the same order (runtime.data: batches depend on the seed and the step only).

    python -m benchmarks.diloco_quality [--steps 320]   # writes benchmarks/results/diloco_quality.json (~1-2 min)

The figure is each mode's held-out loss at the last step against synchronous training's. DiLoCo's paper reports
8 workers at H = 500 matching synchronous training on C4 at 150M-400M parameters over 88k steps; this is a tiny
model over a few hundred steps with 2 workers, a different regime, and the result is what it is.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.common import write

MODES = {"synchronous": None, "diloco H=8": {"mode": "diloco", "options": {"every": 8}},
         "diloco H=32": {"mode": "diloco", "options": {"every": 32}},
         "streaming H=8": {"mode": "streaming", "options": {"every": 8, "fragments": 2, "delay": 1}},
         "streaming H=32": {"mode": "streaming", "options": {"every": 32, "fragments": 4, "delay": 1}},
         "diloco H=8, 4 bits": {"mode": "diloco", "options": {"every": 8, "bits": 4}},
         "streaming H=8, 4 bits": {"mode": "streaming", "options": {"every": 8, "fragments": 2, "delay": 1, "bits": 4}},
         "local SGD H=8": {"mode": "localsgd", "options": {"every": 8}},
         "local SGD H=32": {"mode": "localsgd", "options": {"every": 32}}}
GLOBAL_BATCH, LR, VOCAB, EVAL_EVERY, EVAL_BATCHES = 16, 3e-3, 64, 64, 16


def stream(n: int, rng: np.random.Generator) -> np.ndarray:
    """The learnable-in-part token stream of the module docstring."""
    out = np.zeros(n, dtype=np.uint16)
    noise, jumps = rng.random(n), rng.integers(0, VOCAB, n)
    for i in range(1, n):
        out[i] = (3 * out[i - 1] + 1) % VOCAB if noise[i] < 0.8 else jumps[i]
    return out


def plan_dict(sync: dict | None) -> dict:
    """tiny-gpt on 2 data-parallel CPU ranks (DDP), one micro-batch of 8 per rank, Adam."""
    from partita.planner.api import plan
    from partita.planner.search import TrainConfig
    p = plan("tiny-gpt", cluster="2xcpu", train=TrainConfig(global_batch=GLOBAL_BATCH, dtype="fp32"), dp=2, zero=0,
             tp=1, pp=1, micro_batch=GLOBAL_BATCH // 2).to_dict()
    if sync is not None:
        p["sync"] = sync
    return p


def measure(steps: int) -> dict:
    from partita.runtime.api import launch
    rng = np.random.default_rng(0)
    out: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        stream(400_000, rng).tofile(tmp / "train.bin")
        stream(50_000, rng).tofile(tmp / "held.bin")
        for name, sync in MODES.items():
            path, losses = tmp / "plan.json", tmp / "out.json"
            path.write_text(json.dumps(plan_dict(sync)))
            t0 = time.perf_counter()
            code = launch(path, "tiny-gpt", steps, lr=LR, data=str(tmp / "train.bin"), eval_data=str(tmp / "held.bin"),
                          eval_every=EVAL_EVERY, eval_batches=EVAL_BATCHES, log_every=0, losses_out=str(losses))
            if code:
                raise SystemExit(f"{name}: partita run exited {code}")
            r = json.loads(losses.read_text())
            out[name] = {"eval_losses": r["eval_losses"], "final_eval_loss": r["eval_losses"][-1][1],
                         "wall_s": time.perf_counter() - t0}
            print(f"{name:>14}: held-out loss {[round(v, 4) for _, v in r['eval_losses']]}", flush=True)
    base = out["synchronous"]["final_eval_loss"]
    for r in out.values():
        r["vs_synchronous"] = r["final_eval_loss"] / base - 1
    return {"steps": steps, "global_batch": GLOBAL_BATCH, "lr": LR, "seed": 0, "modes": out,
            "command": f"python -m benchmarks.diloco_quality --steps {steps}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=320, help="training steps per run (a multiple of 32)")
    args = ap.parse_args(argv)
    result = measure(args.steps)
    write("diloco_quality", result)
    for name, r in result["modes"].items():
        print(f"{name:>14}: {r['final_eval_loss']:.4f} ({100 * r['vs_synchronous']:+.1f}% vs synchronous)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
