"""Deliberately wrong runtimes for the negative tests of --verify: a torchrun worker that patches one
runtime function, then runs the ordinary entry point. Lives under tests/, so no user of the runtime can
turn a gradient sync off by accident (an environment variable in runtime/parallel/apply.py used to).

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/runtime/injected_bugs.py \\
        BUG train PLAN --model M --steps N --verify ...     # runtime.train's command line
    ... tests/runtime/injected_bugs.py BUG plans OUT STEPS PLAN...   # runtime.run(verify=True) on each plan
                                                                      # in one process group; rank 0 writes
                                                                      # {plan: summary} to OUT as JSON

BUG is one of `BUGS` ("none" patches nothing):
- skip-dp-grad-sync: data-parallel gradients are never averaged -- DDP never all-reduces its buckets, and
  the by-hand path (runtime.parallel.apply.average_grads, used with tp > 1 or pp > 1) does nothing.
- drop-tp-input-grad-reduce: a column-parallel layer's input gradient is not all-reduced over tp in the
  backward (Megatron's f operator loses its backward all-reduce): each tp rank passes on only its
  shard's partial sum, so the norms and layers before it, and the embeddings, get wrong gradients. The
  loss of step 1 is unchanged; only the update shows it.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

BUGS = ("none", "skip-dp-grad-sync", "drop-tp-input-grad-reduce")


def skip_dp_grad_sync() -> None:
    import partita.runtime.parallel.apply as apply

    class NoSyncDDP(apply.DDP):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.require_backward_grad_sync = False  # what DDP.no_sync() sets, for the whole run

    apply.DDP = NoSyncDDP
    apply.average_grads = lambda params, group, size: None


def drop_tp_input_grad_reduce() -> None:
    from torch.distributed.tensor import DTensor, Replicate

    from partita.runtime.parallel import tp

    original = tp.Colwise._prepare_input_fn

    def prepare(input_layouts, desired_input_layouts, mod, inputs, device_mesh):
        x = original(input_layouts, desired_input_layouts, mod, inputs, device_mesh)
        if isinstance(x, DTensor) and x.requires_grad:
            # the input's gradient is Partial (a sum over the tp shards); relabel it Replicate, so the
            # backward of the input's from_local/redistribute finds nothing to reduce
            x.register_hook(lambda g: DTensor.from_local(g.to_local(), g.device_mesh, (Replicate(),),
                                                         run_check=False) if g.placements[0].is_partial() else g)
        return x

    tp.Colwise._prepare_input_fn = staticmethod(prepare)


def inject(bug: str) -> None:
    if bug not in BUGS:
        raise SystemExit(f"unknown bug {bug!r}; one of {BUGS}")
    if bug != "none":
        globals()[bug.replace("-", "_")]()


def run_plans(out: str, steps: int, plans: list[str]) -> None:
    """partita.runtime.run(verify=True) on each plan in one process group; rank 0 writes the summaries."""
    import torch.distributed as dist

    from spawned import teardown

    import partita.runtime as runtime
    from partita.runtime.launcher.mesh import init_default

    init_default()
    results = {}
    for path in plans:
        name = json.loads(Path(path).read_text())["model"]["name"]
        try:
            r = runtime.run(path, name, steps=steps, verify=True, print_report=False)
        except runtime.VerifyFailed as e:  # raised on every rank; the run is attached
            r = e.result
        results[Path(path).stem] = {"verified": r.verified, "losses": r.losses,
                                    "reference_losses": r.reference_losses, "max_abs_diff": r.max_abs_diff,
                                    "checks": [c.as_dict() for c in r.checks]}
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(results, indent=2))
    teardown()


def main(argv: list[str]) -> int:
    bug, mode, rest = argv[0], argv[1], argv[2:]
    inject(bug)
    if mode == "train":
        from partita.runtime.train import main as train_main
        return train_main(rest)
    if mode == "plans":
        run_plans(rest[0], int(rest[1]), rest[2:])
        return 0
    raise SystemExit(f"mode {mode!r}: train or plans")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
