"""The `partita` command line.

    partita plan --model gpt3-175b --cluster 128x8xA100-80GB --global-batch 1536 --seq 2048
    partita plan --model tiny-gpt --cluster 4xcpu --global-batch 8 --out plan.json
    partita plan --model gpt3-175b --cluster 128x8xA100-80GB --global-batch 1536 --tp 8 --pp 16 --recompute full
    partita explain plan.json
    partita run plan.json --model tiny-gpt --steps 3 --verify
    partita export plan.json --to slurm --model tiny-gpt --partition gpu --time 01:00:00 --out train.sbatch
    partita models

A user error (unknown model, malformed cluster, a model that cannot fit, a bad plan file) prints one line
`partita: error: ...` and exits with code 2. `run` launches torchrun on `partita.runtime.train` in a subprocess:
the planner never imports the runtime (DESIGN.md layering).
"""
from __future__ import annotations

import argparse
import os
import sys

from partita.costmodel.errors import PartitaError
from partita.runtime.launcher.child import run_forwarding_signals
from partita.runtime.launcher.flags import NODE_FLAGS, RECIPE_FLAGS, RUN_FLAGS, add_flags, to_argv
from partita.costmodel.hardware import DEFAULT_ALLOCATOR_HEADROOM
from partita.planner.plan import MASTER_WEIGHTS, RECOMPUTE
from partita.planner.plan import planset
from partita.planner.plan.schedules import AUTO, SCHEDULES
from partita.runtime.launcher.inputs import job_environment_error, option_errors, output_errors


def _cmd_plan(args) -> int:
    from partita.planner.api import plan as make_plan
    from partita.planner.search import TrainConfig
    from partita.costmodel.hardware import parse_cluster

    cluster = parse_cluster(args.cluster)
    # no --dtype: TrainConfig's default, which planner.api resolves by device kind (api.default_dtype)
    train = TrainConfig(global_batch=args.global_batch, seq_len=args.seq, optimizer=args.optimizer,
                        schedule=args.schedule, master_weights=args.master_weights,
                        **({"dtype": args.dtype} if args.dtype else {}))
    space = _space_from_args(args)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    show = not args.json and err.is_terminal
    with Progress(TextColumn("searching plans"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=not show) as bar:
        task = bar.add_task("search", total=None)

        def progress(i, n):
            bar.update(task, total=n, completed=i + 1)

        if args.nnodes:
            return _plan_set(args, cluster, train, space, progress)
        p = make_plan(args.model, cluster=cluster, train=train, progress=progress, baselines=args.baselines,
                      space=space, sparse=_sparse_from_args(args), memory_headroom=args.memory_headroom)
    if args.mtbf:
        p.predicted["resilience"] = _resilience(args, p, cluster.nodes).to_dict()
    if args.out:
        p.save(args.out)
    if args.json:
        sys.stdout.write(p.to_json())
    else:
        from partita.planner.plan.explain import print_plan
        print_plan(p)
        if args.mtbf:
            r = _resilience(args, p, cluster.nodes)
            print("\n" + r.line() + "".join(f"\n  assumed: {a}" for a in r.assumptions))
        if args.out:
            print(f"\nplan written to {args.out}")
    return 0


def _resilience(args, p, nodes: int):
    from partita.planner.estimate import resilience
    return resilience.price_plan(p, nodes=nodes, mtbf_s=args.mtbf * resilience.HOUR, storage_bw=_bandwidth(args),
                                 restart_s=args.restart_seconds)


def _bandwidth(args) -> float | None:
    return None if args.checkpoint_bandwidth is None else args.checkpoint_bandwidth * 1e9


def _plan_set(args, cluster, train, space, progress) -> int:
    """`partita plan --nnodes MIN:MAX`: one plan per size, the table of what each lost node costs."""
    import json
    from partita.planner.api import plan_set
    if args.baselines or _sparse_from_args(args) is not None:
        raise PartitaError("--nnodes plans a dense model's sizes; leave out --baselines and the embedding flags")
    s = plan_set(args.model, cluster=cluster, train=train, nnodes=args.nnodes, progress=progress, space=space,
                 memory_headroom=args.memory_headroom, mtbf_h=args.mtbf, storage_bw=_bandwidth(args),
                 restart_s=args.restart_seconds)
    if args.out:
        s.save(args.out)
    if args.json:
        sys.stdout.write(json.dumps(s.summary(), indent=2) + "\n")
        return 0
    print(f"{s.full.plan.model['name']} on {args.nnodes[0]} to {args.nnodes[1]} nodes of {cluster.devices_per_node} "
          f"{cluster.device.name}, global batch {train.global_batch} at every size")
    print(s.table())
    if args.out:
        print(f"\nplans written to {args.out}/ (nodes-N.json, one per size; plan-set.json, this table)")
    return 0


def _sparse_from_args(args):
    """The recommendation-model flags as a rec_plan.SparseInputs, or None when none is given."""
    given = {k: getattr(args, k) for k in ("data", "zipf", "pooling", "sparse_optimizer", "embedding_sharding",
                                           "embedding_costs") if getattr(args, k) is not None}
    if not given:
        return None
    from partita.planner.sparse.rec_plan import SparseInputs
    return SparseInputs(data=args.data, zipf=args.zipf, pooling=args.pooling,
                        optimizer=args.sparse_optimizer or "rowwise_adagrad", fixed=args.embedding_sharding,
                        pricing=args.embedding_costs or "partita")


def _space_from_args(args):
    """The what-if flags as a SearchSpace: each given flag fixes its choice, the rest stay searched."""
    from partita.planner.enumerate.space import SearchSpace
    fixed = {name: (getattr(args, name),) for name in ("tp", "pp", "dp", "cp", "ep", "zero", "micro_batch",
                                                       "virtual_stages")
             if getattr(args, name) is not None}
    if args.recompute is not None:
        fixed["recompute"] = args.recompute
    if args.full_recompute_layers is not None:
        fixed["full_recompute_layers"] = args.full_recompute_layers
    if args.stage_layers is not None:
        fixed["stage_layers"] = args.stage_layers
    if args.sequence_parallel is not None:
        fixed["sequence_parallel"] = (args.sequence_parallel == "on",)
    if args.offload is not None:
        fixed["offload"] = args.offload == "on"
    if args.kernels is not None:
        fixed["kernels"] = args.kernels
    for name in ("tp_comm_overlap", "p2p_overlap"):
        if getattr(args, name) is not None:
            fixed[name] = (getattr(args, name) == "on",)
    if args.stack is not None:
        fixed["stack"] = args.stack
    if args.sync is not None:  # an unknown mode: SearchSpace's one line (no argparse usage block)
        fixed["sync"] = tuple(args.sync.split(",")) if "," in args.sync else args.sync
    for name in ("sync_every", "sync_bits"):
        if getattr(args, name) is not None:
            fixed[name] = getattr(args, name)
    if args.sync_allow_any_every:
        fixed["sync_allow_any_every"] = True
    return SearchSpace(**fixed)


def _cmd_explain(args) -> int:
    from partita.planner.plan.explain import print_plan
    from partita.planner.plan import Plan
    from partita.planner.plan import planset
    if planset.is_plan_set(args.plan):
        s = planset.from_directory(args.plan)
        print(f"plan set {args.plan}: {s.full.plan.model.get('name')}, {s.sizes[0].nodes} to {s.full.nodes} nodes")
        print(s.table())
        return 0
    print_plan(Plan.load(args.plan))
    return 0


def _cmd_compare(args) -> int:
    from partita.report.compare import print_comparison
    from partita.planner.plan import Plan
    print_comparison(Plan.load(args.a), Plan.load(args.b), args.a, args.b)
    return 0


def _cmd_run(args) -> int:
    from partita.planner.plan import Plan
    # values argparse cannot refuse by type: one line, exit code 2, before anything is launched
    for name, value, least in (("--steps", args.steps, 1), ("--checkpoint-every", args.checkpoint_every, 0),
                               ("--max-restarts", args.max_restarts, 0), ("--nnodes", args.nnodes, 1),
                               ("--log-every", args.log_every, 0), ("--keep", args.keep, 0)):
        if value is not None and value < least:
            raise PartitaError(f"{name} must be {'at least 1' if least else '>= 0'}")
    nnodes = args.nnodes or 1
    if nnodes > 1 and not args.rdzv_endpoint:
        raise PartitaError(f"--nnodes {nnodes} needs --rdzv-endpoint HOST:PORT (the same on every node)")
    for name, value in (("--rdzv-timeout", args.rdzv_timeout), ("--hang-timeout", args.hang_timeout)):
        if value is not None and not 0 < value <= 86400:
            raise PartitaError(f"{name} must be more than 0 and at most 86400 seconds")
    if why := job_environment_error(os.environ):
        raise PartitaError(why)
    if planset.is_plan_set(args.plan):
        args.plan = _plan_of_set(args.plan, nnodes)
    given = {"lr": 1e-3 if args.lr is None else args.lr, "seed": 0 if args.seed is None else args.seed}
    recipe = {name: getattr(args, name) for name in RECIPE_FLAGS}
    errors = option_errors(**given, **recipe) + output_errors(
        losses_out=args.losses_out, tensorboard=args.tensorboard, save_final=args.save_final,
        inputs={"the plan": args.plan, "the --data file": args.data, "the --eval-data file": args.eval_data})
    if errors:  # before the pre-flight, before training: an output checked only at the end lost the run
        raise PartitaError(errors[0])
    plan = Plan.load(args.plan)  # validate before launching anything
    world = plan.mesh.world_size
    if world % nnodes:
        fits = ", ".join(str(n) for n in range(1, world + 1) if world % n == 0)
        raise PartitaError(f"the plan is for {world} ranks, which {nnodes} nodes cannot share equally "
                           f"(processes per node = world size / nnodes): use --nnodes {fits}")
    nproc = world // nnodes
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    # torchrun's restarts on its shared rendezvous store would see the failed attempt's keys (pytorch#135712):
    # give every attempt a fresh store
    env.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    flags = ["--model", args.model, *to_argv(args, RUN_FLAGS)]
    launcher = ["--nproc-per-node", str(nproc), *to_argv({**vars(args), "nnodes": nnodes}, NODE_FLAGS)]
    # runtime.train with launcher flags runs the pre-flight checks (runtime.train._check_before_launch), then
    # torchrun's agent for this node (standalone on one node, c10d rendezvous across nodes) and reports the
    # first failing rank as one line; signals sent to this process reach it, and through it the workers
    # (partita.runtime.launcher.child)
    cmd = [sys.executable, "-m", "partita.runtime.train", args.plan, *flags, *launcher]
    return run_forwarding_signals(cmd, env)


def _plan_of_set(directory: str, nnodes: int) -> str:
    """The plan file of a plan set (`partita plan --nnodes`) for `nnodes` nodes, said in one line."""
    used, p = planset.for_nodes(directory, nnodes)
    if used != nnodes:
        raise PartitaError(f"plan set {directory!r}: with {nnodes} node(s) its fastest plan is the one for {used} "
                           f"(nodes-{used}.json); start {used} nodes (--nnodes {used}), the others as spares")
    path = os.path.join(directory, planset.FILE.format(used))
    m = p.mesh
    print(f"partita: plan set {directory}: {planset.FILE.format(used)} for {used} node(s) (pp={m.pp} dp={m.dp} "
          f"tp={m.tp}, predicted step {p.predicted['step_time_s']:.4g} s)", file=sys.stderr, flush=True)
    return path


def _cmd_export(args) -> int:
    from partita.export import ExportError, SlurmOptions, export
    from partita.planner.plan import Plan
    plan = Plan.load(args.plan)
    slurm_flags = ("model", "steps", "gpus_per_node", "partition", "time", "account", "job_name", "port", "data",
                   "checkpoint_dir", "checkpoint_every", "max_restarts", "python")
    if args.to != "slurm":
        given = [name for name in slurm_flags if getattr(args, name) is not None]
        if given:
            raise ExportError(f"{', '.join('--' + n.replace('_', '-') for n in given)} apply to --to slurm only")
    slurm = None
    if args.to == "slurm" and args.model is not None:
        values = {name: getattr(args, name) for name in slurm_flags if getattr(args, name) is not None}
        slurm = SlurmOptions(**values)  # python: the compute nodes' (PATH or --python), not this machine's venv
    text = export(plan, args.to, plan_path=os.path.abspath(args.plan), slurm=slurm)
    if not args.out:
        sys.stdout.write(text)
        return 0
    try:
        with open(args.out, "w") as f:
            f.write(text)
        if args.to == "slurm":
            os.chmod(args.out, 0o755)
    except OSError as e:
        raise ExportError(f"cannot write {args.out!r}: {e.strerror}") from None
    print(f"{args.to} export written to {args.out}")
    return 0


def _cmd_calibrate(args) -> int:
    from partita.costmodel.calibrate import main as calibrate_main
    argv = (["--out", args.out] + (["--ranks", str(args.ranks)] if args.ranks else []) + (["--quick"] if args.quick else [])
            + (["--force"] if args.force else []))
    return calibrate_main(argv)


def _cmd_models(args) -> int:
    from partita.costmodel.models.configs import PRESETS  # no torch: a listing
    print(f"{'preset':<16} {'family':<6} {'layers':>6} {'hidden':>6} {'heads':>5} {'kv':>4} {'ffn':>6} "
          f"{'vocab':>7} {'seq':>5}")
    for name, c in sorted(PRESETS.items()):
        print(f"{name:<16} {c.family:<6} {c.layers:>6} {c.hidden:>6} {c.heads:>5} {c.kv_heads:>4} {c.ffn:>6} "
              f"{c.vocab:>7} {c.seq:>5}")
    from partita.costmodel.models.configs import CNN_PRESETS
    print(f"\n{'CNN preset':<16} {'depth':>6} {'width':>6} {'image':>6} {'classes':>8}")
    for name, c in CNN_PRESETS.items():
        depth = sum(c.blocks) * (3 if c.bottleneck else 2) + 2  # the convolutions and the classifier, as ResNet counts
        print(f"{name:<16} {depth:>6} {c.width:>6} {c.image:>6} {c.classes:>8}")
    print("\nor a family: gpt:layers=..,hidden=..,heads=..,seq=..,vocab=..[,ffn=..][,kv_heads=..]"
          "[,attention=sdpa|math][,dropout=0.1]  llama:... (the same keys)  resnet:depth=..,width=..,image=..,classes=..\n"
          "or hf:FAMILY[-cls][:key=value,...] (a transformers model type built from its config; -cls: its "
          "classification head, e.g. hf:bert-cls, hf:vit)\n"
          "or your own: package.module:factory returning (module, example_inputs[, loss_fn]) (docs/own-models.md: "
          "Train your own model on your own data)")
    print("recommendation models: dlrm-criteo-1tb (the MLPerf DLRM), dlrm:tables=..,rows=..[,dim=..,dense=..,"
          "bottom=a-b-c,top=a-b-1,pooling=..], or a factory with nn.EmbeddingBag tables")
    return 0


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


def _policies(text: str) -> tuple[str, ...]:
    """--recompute's value: one policy, or a comma list of them."""
    policies = tuple(dict.fromkeys(x.strip() for x in text.split(",")))
    bad = [x for x in policies if x not in RECOMPUTE]
    if bad or not policies:
        raise argparse.ArgumentTypeError(f"{', '.join(bad) or repr(text)} is not a recompute policy; "
                                         f"choose among {', '.join(RECOMPUTE)} (or a comma list of them)")
    return policies


def _counts(text: str) -> tuple[int, ...]:
    """--stage-layers' value: a comma list of whole numbers (SearchSpace.stage_layers says what else it must be)."""
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma list of layer counts (e.g. 10,11,11,10)") from None


def _add_what_if_flags(p: argparse.ArgumentParser) -> None:
    w = p.add_argument_group("what-if (each flag fixes one decision; the others are still searched)")
    w.add_argument("--tp", type=int, metavar="N", help="tensor-parallel degree (divides the devices per node)")
    w.add_argument("--pp", type=int, metavar="N", help="pipeline stages")
    w.add_argument("--stage-layers", type=_counts, metavar="N,N,...",
                   help="pin the pipeline split: repeated layers per stage, first stage first (10,11,11,10), summing "
                        "to the model's layers; fixes --pp to their number (Megatron-LM's "
                        "--decoder-first-pipeline-num-layers, torchtitan's split points)")
    w.add_argument("--dp", type=int, metavar="N",
                   help="data-parallel degree (tp x pp x dp x cp = number of devices)")
    w.add_argument("--cp", type=int, metavar="N",
                   help="context-parallel degree: each sequence split over N ranks (long sequences)")
    w.add_argument("--ep", type=int, metavar="N",
                   help="expert-parallel degree: each MoE layer's experts sharded over N of the dp ranks")
    w.add_argument("--zero", type=int, choices=[0, 1, 2, 3],
                   help="ZeRO stage (1-3 need dp > 1): 1 shards optimizer state (torch's ZeroRedundancyOptimizer; "
                        "exported as Megatron's --use-distributed-optimizer), 2 gradients too, 3 parameters too")
    w.add_argument("--recompute", type=_policies, metavar="{" + ",".join(RECOMPUTE) + "}",
                   help="activation recompute policy of every layer (op: torchtitan's per-op selective "
                        "checkpointing, every other matmul output kept), or a comma list the search picks "
                        "from per layer (none,full)")
    w.add_argument("--full-recompute-layers", type=int, metavar="N",
                   help="exactly N layers recompute in full, the rest take the other allowed policies "
                        "(Megatron-LM's --recompute-num-layers; with --recompute none,full: N checkpointed "
                        "blocks, the rest keep their activations)")
    w.add_argument("--sequence-parallel", choices=["on", "off"],
                   help="Megatron sequence parallelism in the tensor-parallel layers (on needs tp > 1)")
    w.add_argument("--micro-batch", type=int, metavar="N", help="samples per micro-batch per data-parallel rank")
    w.add_argument("--schedule", choices=[AUTO, *SCHEDULES], default=AUTO,
                   help="pipeline schedule (default auto: the planner picks 1F1B or interleaved 1F1B)")
    w.add_argument("--virtual-stages", type=int, metavar="N",
                   help="model chunks per device: N > 1 is interleaved 1F1B with N chunks, 1 no interleaving")
    w.add_argument("--offload", choices=["on", "off"],
                   help="off: nothing offloaded to host memory; on: offload allowed and searched per layer "
                        "(the default; forcing every layer to offload is rarely feasible)")
    w.add_argument("--kernels", choices=["eager", "compiled"],
                   help="how the layers run: eager (the default) or compiled (torch.compile per layer fuses "
                        "elementwise ops and norms and saves fewer activations; prices a compiled run such as "
                        "torchtitan's --compile, and `partita run` compiles each layer of such a plan)")
    w.add_argument("--tp-comm-overlap", choices=["on", "off"],
                   help="on: sequence parallelism's collectives pipelined with the GEMMs they feed (Megatron-Core "
                        "--tp-comm-overlap, torch async TP; priced, not run by partita run). Default: as the stack "
                        "allows, off for the pytorch stack partita runs")
    w.add_argument("--p2p-overlap", choices=["on", "off"],
                   help="on: an interleaved pipeline's sends overlapped with compute (Megatron-Core "
                        "--overlap-p2p-communication; priced, not run by partita run). Default: as the stack allows")


def _add_rec_flags(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("recommendation models (models with nn.EmbeddingBag tables or a TorchRec "
                             "EmbeddingBagCollection, e.g. dlrm-criteo-1tb)")
    g.add_argument("--data", metavar="FILE", help="a sample of the sparse features: .npz with one array of IDs per "
                   "table (named as its module, or a TorchRec table by its config name) and optionally NAME.lengths "
                   "(IDs per sample)")
    g.add_argument("--zipf", type=float, metavar="ALPHA", help="IDs Zipf-distributed with exponent ALPHA over each "
                   "table's rows (default without --data: uniform)")
    g.add_argument("--pooling", type=float, metavar="L", help="IDs per sample and feature with --zipf "
                   "(default: the model's example batch)")
    g.add_argument("--sparse-optimizer", choices=["rowwise_adagrad", "adam", "sgd"], default=None,
                   help="the tables' fused optimizer (default rowwise_adagrad)")
    g.add_argument("--embedding-sharding", metavar="TABLE=SHARDING[:K][@PLACEMENT],...",
                   help="fix tables' sharding (data_parallel, table_wise, column_wise:K, row_wise, table_row_wise) "
                        "and placement (hbm, cache, host); TABLE * for every table")
    g.add_argument("--embedding-costs", choices=["partita", "torchrec"], default=None,
                   help="who prices the tables: partita's byte model (default), or TorchRec's own estimator "
                        "(EmbeddingPerfEstimator; the program then minimises what TorchRec's planner does)")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="partita", description="Plan and run parallel training for PyTorch models.")
    sub = ap.add_subparsers(dest="command", required=True)

    for add in (_add_plan, _add_explain_compare, _add_run, _add_export, _add_calibrate_models):
        add(sub)
    return ap


def _add_plan(sub) -> None:
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
    p.add_argument("--global-batch", type=int, required=True, help="samples per optimizer step")
    p.add_argument("--seq", type=int, default=None, help="sequence length (default: the model's)")
    p.add_argument("--dtype", choices=["bf16", "fp32"], default=None,
                   help="training precision (default: bf16 on GPUs, fp32 on cpu)")
    p.add_argument("--master-weights", choices=list(MASTER_WEIGHTS), default="fp32",
                   help="fp32 (default): a bf16 model's optimizer steps an fp32 master copy, 16 bytes of state per "
                        "parameter with Adam; none: pure bf16, parameters, gradients and Adam moments in bf16, "
                        "8 bytes (nanotron, torchtitan on a bf16 model); implies --dtype bf16")
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    from partita.costmodel.hardware.stacks import DEFAULT_STACK, STACKS
    p.add_argument("--stack", choices=list(STACKS), default=None,
                   help=f"software stack the plan is priced for (default {DEFAULT_STACK}, partita's runtime); "
                        "te-2024 (Megatron-Core + Transformer Engine) also searches its TP and pipeline-send "
                        "overlaps and prices its distributed optimizer -- a plan partita prices but does not run")
    p.add_argument("--memory-headroom", type=_fraction, default=None, metavar="FRACTION",
                   help="a flat fraction of each device's memory, after the CUDA context and NCCL reserve, that "
                        "plans leave free for the caching allocator (default on GPU presets: the allocator's cache "
                        "predicted per stage, costmodel.hardware.ALLOCATOR_CACHE_FACTOR; on cpu "
                        f"{DEFAULT_ALLOCATOR_HEADROOM:g})")
    from partita.planner.plan.sync import SYNC_MODES, SYNCHRONOUS
    p.add_argument("--sync", default=None, metavar="{auto," + ",".join(SYNC_MODES) + "}",
                   help=f"how data-parallel replicas agree on the weights (planner.plan.sync): a mode, several "
                        f"separated by commas, or auto (default: every mode, the fastest within its quality "
                        f"envelope; {SYNCHRONOUS} on a cluster without islands)")
    p.add_argument("--sync-every", type=int, default=None, metavar="H",
                   help="DiLoCo's inner steps per outer step (default: the planner picks H)")
    p.add_argument("--sync-bits", type=int, default=None, choices=(16, 32),
                   help="bit width of DiLoCo's outer all-reduce (default 32)")
    p.add_argument("--sync-allow-any-every", action="store_true",
                   help="price an H above DiLoCo's published envelope (500)")
    _add_what_if_flags(p)
    _add_rec_flags(p)
    _add_elastic_flags(p)
    p.add_argument("--baselines", action="store_true",
                   help="also plan DDP, FSDP, Megatron TP x PP and recompute-everything under the same cost model")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.add_argument("--out", help="also write the plan to this file (with --nnodes: to this directory)")
    p.set_defaults(func=_cmd_plan)


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
    e.add_argument("--restart-seconds", type=float, metavar="S",
                   help="seconds from a failure to the workers started again, before the checkpoint is read "
                        "(default: 60, assumed)")


def _add_explain_compare(sub) -> None:
    e = sub.add_parser("explain", help="print the report of a saved plan", epilog="example: partita explain plan.json")
    e.add_argument("plan")
    e.set_defaults(func=_cmd_explain)

    cp = sub.add_parser("compare", help="what differs between two plans, and where the time goes in each",
                        epilog="example: partita compare fsdp.json megatron.json")
    cp.add_argument("a")
    cp.add_argument("b")
    cp.set_defaults(func=_cmd_compare)


def _add_run(sub) -> None:
    r = sub.add_parser("run", help="train with a plan on local processes or several nodes (torchrun)",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  partita run plan.json --model tiny-gpt --steps 3 --verify\n"
                              "  partita run plan.json --model tiny-gpt --steps 100 --data tokens.bin "
                              "--checkpoint-dir ckpt --checkpoint-every 10 --max-restarts 2\n"
                              "  # on each of 2 nodes (node0 is one of them):\n"
                              "  partita run plan.json --model tiny-gpt --steps 100 --nnodes 2 "
                              "--rdzv-endpoint node0:29400 --rdzv-id job42")
    r.add_argument("plan")
    r.add_argument("--model", required=True, help="model preset or MODEL string, e.g. tiny-gpt")
    add_flags(r, RUN_FLAGS, given_only=True)  # runtime.launcher.flags: the worker's defaults apply
    n = r.add_argument_group("several nodes (run the same command on every node; processes per node = the "
                             "plan's world size / N)")
    add_flags(n, NODE_FLAGS, given_only=True)
    n.add_argument("--node-rank", type=int, metavar="R", help="accepted for batch scripts; c10d rendezvous "
                   "numbers the nodes as they join, so it does not change which ranks a node runs")
    r.set_defaults(func=_cmd_run)


def _add_export(sub) -> None:
    from partita.export import FORMATS
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
    xs.add_argument("--model", help="MODEL to train (required for slurm)")
    xs.add_argument("--steps", type=int, metavar="N", help="training steps (default 10)")
    xs.add_argument("--gpus-per-node", type=int, metavar="G",
                    help="processes per node (default: the plan's devices per node)")
    xs.add_argument("--partition", metavar="P")
    xs.add_argument("--time", metavar="T", help="time limit, e.g. 04:00:00")
    xs.add_argument("--account", metavar="A")
    xs.add_argument("--job-name", metavar="NAME", help="default partita")
    xs.add_argument("--port", type=int, help="rendezvous port on the first node (default 29500)")
    xs.add_argument("--data", metavar="FILE", help="token file for runtime.train (as in `partita run`)")
    xs.add_argument("--checkpoint-dir", metavar="DIR", help="DCP checkpoints (a path every node can write)")
    xs.add_argument("--checkpoint-every", type=int, metavar="N", help="save a checkpoint after every N steps")
    xs.add_argument("--max-restarts", type=int, metavar="K", help="torchrun restarts after a failure")
    xs.add_argument("--python", metavar="PATH", help="the interpreter with partita installed on the compute nodes "
                    "(default: python from the job's PATH; $PYTHON overrides either at submission)")
    x.set_defaults(func=_cmd_export)


def _add_calibrate_models(sub) -> None:
    c = sub.add_parser("calibrate", help="measure this machine's devices and links into a resource list",
                       epilog="example: partita calibrate --out cluster.json && "
                              "partita plan --model tiny-gpt --cluster cluster.json --global-batch 8")
    c.add_argument("--out", required=True, help="resource list (JSON) to write")
    c.add_argument("--ranks", type=int, default=None, help="local ranks for the collective measurements: on a CPU "
                   "host >= 2; on a GPU host one per GPU, at most the GPUs (default: every GPU; one GPU: no collectives, "
                   "its preset's links)")
    c.add_argument("--quick", action="store_true", help="fewer matrix and message sizes and repetitions than a full "
                   "calibration (the summary says how long it took)")
    c.add_argument("--force", action="store_true", help="write the figures even when other work kept the machine "
                   "busy before or during the calibration (refused by default: they would price plans for a slower "
                   "machine)")
    c.set_defaults(func=_cmd_calibrate)

    m = sub.add_parser("models", help="list the built-in model presets")
    m.set_defaults(func=_cmd_models)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except PartitaError as e:
        print(f"partita: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before anything was launched (a run passes signals on: partita.runtime.launcher.child)
        print("partita: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
