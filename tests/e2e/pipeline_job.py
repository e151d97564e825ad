"""Run under torchrun by test_pipeline_tied_and_own_loss.py: each (plan file, MODEL) pair trains 3 steps with
`partita.runtime.run(..., verify=True)` in this one launch (one process group), and every rank writes what it got
to OUT.rank<r>.json.

    python -m torch.distributed.run --nproc-per-node 2 tests/e2e/pipeline_job.py OUT PLAN.json MODEL ...
"""
import json
import sys

import torch.distributed as dist

import partita.runtime as runtime
from partita.runtime.launcher.mesh import init_default
from tests.runtime.spawned import teardown  # PYTHONPATH has the repo root (the tests' _env)


def main(out: str, pairs: list[str]) -> None:
    init_default()
    results = {}
    for path, model in zip(pairs[::2], pairs[1::2]):
        r = runtime.run(path, model, steps=3, verify=True, print_report=dist.get_rank() == 0)
        results[model] = {"verified": r.verified, "losses": r.losses, "reference_losses": r.reference_losses,
                          "max_abs_diff": r.max_abs_diff, "param_max_abs_diff": r.param_max_abs_diff}
    with open(f"{out}.rank{dist.get_rank()}.json", "w") as f:
        json.dump(results, f, indent=2)
    teardown()  # every rank's collectives done before any tears down


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
