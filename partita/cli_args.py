"""The `partita` command line's arguments: every command's flags, their types and help (partita.cli runs them)."""
from __future__ import annotations

import argparse

from partita.costmodel.hardware import DEFAULT_ALLOCATOR_HEADROOM
from partita.runtime.launcher.flags import MODEL, NODE_FLAGS, RUN_FLAGS, add_flags, dataclass_flags

def _fraction(text: str) -> float:
    """--memory-headroom's value: a fraction in [0, 1) (0.05 is 5%)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction in [0, 1) (e.g. 0.05 for 5%)")
    return value


def _node_range(text: str) -> tuple[int, int]:
    """--nnodes' value: MIN:MAX node counts (a single N is N:N)."""
    lo, _, hi = text.partition(":")
    try:
        return int(lo), int(hi or lo)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN:MAX node counts (e.g. 3:4)") from None


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (0 < value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def _add_what_if_flags(p: argparse.ArgumentParser) -> None:
    """The flags that fix a choice the search would otherwise make, generated from SearchSpace's and
    TrainConfig's fields in the WHAT_IF group (planner.enumerate.config)."""
    from partita.planner.enumerate.config import WHAT_IF, SearchSpace, TrainConfig
    w = p.add_argument_group("what-if (each flag fixes one decision; the others are still searched)")
    add_flags(w, dataclass_flags(SearchSpace, group=WHAT_IF) + dataclass_flags(TrainConfig, group=WHAT_IF),
              given_only=True)


def _add_rec_flags(p: argparse.ArgumentParser) -> None:
    """The embedding tables' flags, generated from SparseInputs' fields (planner.sparse.inputs)."""
    from partita.planner.sparse.inputs import REC, SparseInputs
    add_flags(p.add_argument_group(REC), dataclass_flags(SparseInputs, group=REC), given_only=True)


def build_parser(handlers: dict) -> argparse.ArgumentParser:
    """The parser of every command; `handlers`: command name -> the function that runs it (partita.cli)."""
    ap = argparse.ArgumentParser(prog="partita", description="Plan and run parallel training for PyTorch models.")
    sub = ap.add_subparsers(dest="command", required=True)

    for add in (_add_plan, _add_explain_compare, _add_run, _add_export, _add_calibrate_models):
        add(sub, handlers)
    return ap


def _add_plan(sub, handlers: dict) -> None:
    p = sub.add_parser("plan", help="find the fastest plan that fits", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  partita plan --model gpt3-175b --cluster 128x8xA100-80GB --global-batch 1536 --seq 2048\n"
                              "  partita plan --model tiny-gpt --cluster 4xcpu --global-batch 8 --out plan.json\n"
                              "  # what-if: price the configuration you run today beside partita's plan\n"
                              "  partita plan --model gpt3-175b --cluster 128x8xA100-80GB --global-batch 1536 "
                              "--tp 8 --pp 16 --dp 8 --recompute full --out mine.json\n"
                              "  partita plan --model gpt3-175b --cluster 128x8xA100-80GB --global-batch 1536 "
                              "--out best.json\n"
                              "  partita compare mine.json best.json")
    p.add_argument("--model", required=True, help="preset (see `partita models`), gpt:key=value,... or llama:... "
                   "(keys layers, hidden, heads, vocab, seq, ffn, kv_heads, attention=sdpa|math, dropout), "
                   "hf:..., resnet:..., or module:factory")
    p.add_argument("--cluster", required=True, help="8xA100-80GB, 128x8xA100-80GB, 4xcpu ...")
    from partita.planner.enumerate.config import SearchSpace, TrainConfig
    # TrainConfig's and SearchSpace's own flags, generated from their fields (what was not given: their defaults)
    add_flags(p, dataclass_flags(TrainConfig) + dataclass_flags(SearchSpace), given_only=True)
    p.add_argument("--memory-headroom", type=_fraction, default=None, metavar="FRACTION",
                   help="a flat fraction of each device's memory, after the CUDA context and NCCL reserve, that "
                        "plans leave free for the caching allocator (default on GPU presets: the allocator's cache "
                        "predicted per stage, costmodel.hardware.ALLOCATOR_CACHE_FACTOR; on cpu "
                        f"{DEFAULT_ALLOCATOR_HEADROOM:g})")
    _add_what_if_flags(p)
    _add_rec_flags(p)
    _add_elastic_flags(p)
    p.add_argument("--baselines", action="store_true",
                   help="also plan DDP, FSDP, Megatron TP x PP and recompute-everything under the same cost model")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--out", help="also write the plan to this file (with --nnodes: to this directory)")
    p.set_defaults(func=handlers["plan"])


def _add_elastic_flags(p: argparse.ArgumentParser) -> None:
    e = p.add_argument_group("elastic jobs and failures (planner.estimate.resilience)")
    e.add_argument("--nnodes", type=_node_range, metavar="MIN:MAX",
                   help="plan every size from MIN to MAX nodes (--cluster is the full allocation, MAX nodes) and show "
                        "what losing nodes costs; --out DIR writes one plan per size (nodes-N.json) and plan-set.json")
    e.add_argument("--mtbf", type=_positive, metavar="HOURS",
                   help="the job's mean hours between interruptions at the cluster's size (Llama 3 on 16,384 GPUs: "
                        "3.09): add the checkpoint interval (Young/Daly) and the expected time lost to failures")
    e.add_argument("--checkpoint-bandwidth", type=_positive, metavar="GB/s",
                   help="checkpoint storage bandwidth per node, writing and reading, in GB/s (default: 2, assumed)")
    e.add_argument("--snapshot-bandwidth", type=_positive, metavar="GB/s",
                   help="bytes a rank copies into its node's memory per second for a snapshot (--snapshot-every), "
                        "in GB/s, capped by the device's host link (default: 5, assumed)")
    e.add_argument("--restart-seconds", type=float, metavar="S",
                   help="seconds from a failure to the workers started again, before the checkpoint is read "
                        "(default: 60, assumed)")


def _add_explain_compare(sub, handlers: dict) -> None:
    e = sub.add_parser("explain", help="print the report of a saved plan", epilog="example: partita explain plan.json")
    e.add_argument("plan")
    e.set_defaults(func=handlers["explain"])

    cp = sub.add_parser("compare", help="what differs between two plans, and where the time goes in each",
                        epilog="example: partita compare fsdp.json megatron.json")
    cp.add_argument("a")
    cp.add_argument("b")
    cp.set_defaults(func=handlers["compare"])


def _add_run(sub, handlers: dict) -> None:
    r = sub.add_parser("run", help="train with a plan on local processes or several nodes (torchrun)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  partita run plan.json --model tiny-gpt --steps 3 --verify\n"
                              "  partita run plan.json --model tiny-gpt --steps 100 --data tokens.bin "
                              "--checkpoint-dir ckpt --checkpoint-every 10 --max-restarts 2\n"
                              "  # on each of 2 nodes (node0 is one of them):\n"
                              "  partita run plan.json --model tiny-gpt --steps 100 --nnodes 2 "
                              "--rdzv-endpoint node0:29400 --rdzv-id job42")
    r.add_argument("plan")
    add_flags(r, (MODEL, *RUN_FLAGS), given_only=True)  # runtime.launcher.flags: the worker's defaults apply
    n = r.add_argument_group("several nodes (run the same command on every node; processes per node = the "
                             "plan's world size / N)")
    add_flags(n, NODE_FLAGS, given_only=True)
    n.add_argument("--node-rank", type=int, metavar="R", help="accepted for batch scripts; c10d rendezvous "
                   "numbers the nodes as they join, so it does not change which ranks a node runs")
    r.set_defaults(func=handlers["run"])


def _add_export(sub, handlers: dict) -> None:
    from partita.export import FORMATS
    from partita.export.slurm import slurm_flags
    x = sub.add_parser("export", help="translate a plan into a SLURM batch script, Megatron-LM arguments or a "
                       "torchtitan config", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  partita export plan.json --to slurm --model tiny-gpt --steps 100 "
                              "--partition gpu --time 02:00:00 --out train.sbatch && sbatch train.sbatch\n"
                              "  partita export plan.json --to megatron\n"
                              "  partita export plan.json --to torchtitan --out overrides.toml\n"
                              "what has no equivalent in the target is said in a '# partita:' comment")
    x.add_argument("plan")
    x.add_argument("--to", required=True, choices=list(FORMATS))
    x.add_argument("--out", metavar="FILE", help="write to FILE instead of standard output")
    xs = x.add_argument_group("--to slurm (the script starts runtime.train's torchrun launcher on every node)")
    add_flags(xs, slurm_flags(), given_only=True)  # SlurmOptions' fields: the exporter's defaults apply
    x.set_defaults(func=handlers["export"])


def _add_calibrate_models(sub, handlers: dict) -> None:
    c = sub.add_parser("calibrate", help="measure this machine's devices and links into a resource list",
                       epilog="example: partita calibrate --out cluster.json && "
                              "partita plan --model tiny-gpt --cluster cluster.json --global-batch 8")
    from partita.costmodel.calibrate import add_arguments
    add_arguments(c)  # defined once, beside the calibration (python -m partita.costmodel.calibrate takes them too)
    c.set_defaults(func=handlers["calibrate"])

    m = sub.add_parser("models", help="list the built-in model presets")
    m.set_defaults(func=handlers["models"])

    s = sub.add_parser("rendezvous", help="serve the rendezvous store of multi-node runs in a process of its own, so "
                                          "that a job survives the loss of any training node",
                       epilog="example: partita rendezvous --port 29400   (then on every node: partita run ... "
                              "--nnodes 2:4 --rdzv-endpoint HOST:29400)")
    s.add_argument("--port", type=int, required=True, help="the TCP port to serve on (every interface)")
    s.set_defaults(func=handlers["rendezvous"])
