"""A user's training script, run by test_hf_and_api.py under torchrun (2 ranks) in one launch.

It creates the process group itself (so `partita.runtime.run` and `partita.plan_and_run` use it and leave it
alone), plans a HuggingFace Llama on rank 0 with `partita.plan_and_run`, then runs the given plan files
with `partita.runtime.run` on the user's own module builder, each with --verify's comparison. Every rank writes
what it got to OUT.rank<r>.json.

    python -m torch.distributed.run --nproc-per-node 2 tests/e2e/api_job.py OUT PLAN.json ...
"""
import json
import sys

import torch
import torch.distributed as dist

import partita
import partita.runtime as runtime
from partita.costmodel import resolve_model
from partita.runtime.launcher.mesh import init_default
from tests.runtime.spawned import teardown  # PYTHONPATH has the repo root (the tests' _env)


def summary(result) -> dict:
    return {"verified": result.verified, "max_abs_diff": result.max_abs_diff, "losses": result.losses,
            "reference_losses": result.reference_losses, "param_max_abs_diff": result.param_max_abs_diff,
            "applied": result.applied["summary"], "tokens_per_s": result.tokens_per_s}


def file_is(path: str, model) -> bool:
    """Whether the --save-final file holds exactly the returned module's state (names and values)."""
    saved, own = torch.load(path), model.state_dict()
    return saved.keys() == own.keys() and all(torch.equal(saved[k], v) for k, v in own.items())


def main(out: str, plans: list[str]) -> None:
    init_default()
    results = {}
    result = partita.plan_and_run("hf:llama", "2xcpu", {"global_batch": 4, "dtype": "fp32"}, steps=3, verify=True,
                                  plan_out=out + ".plan.json")
    results["plan_and_run"] = summary(result)
    build = resolve_model("hf:llama").build  # the user's module: transformers' LlamaForCausalLM, unchanged
    for i, path in enumerate(plans):
        # the weights are gathered once for both the file and the returned module (runtime.loop.session)
        saved = f"{out}.final{i}.pt"
        result = runtime.run(path, build, steps=3, verify=True, return_model=True, save_final=saved)
        results[path] = summary(result)
        model = result.model  # rank 0: the trained model in this process; None elsewhere
        results[path]["model"] = None if model is None else {
            "type": type(model).__name__,
            "checksum": sum(p.detach().double().sum().item() for p in model.parameters()),  # each tied tensor once
            "param_checksum": result.param_checksum,
            "file_is_the_model": file_is(saved, model)}
    assert dist.is_initialized()  # still the script's group
    with open(f"{out}.rank{dist.get_rank()}.json", "w") as f:
        json.dump(results, f, indent=2)
    teardown()  # every rank's collectives done before any tears down


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
