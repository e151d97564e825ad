"""The `partita` command line.

    partita plan --model gpt3-175b --cluster 128x8xA100-80GB --global-batch 1536 --seq 2048
    partita plan --model tiny-gpt --cluster 4xcpu --global-batch 8 --out plan.json
    partita plan --model gpt3-175b --cluster 128x8xA100-80GB --global-batch 1536 --tp 8 --pp 16 --recompute full
    partita explain plan.json
    partita run plan.json --model tiny-gpt --steps 3 --verify
    partita export plan.json --to slurm --model tiny-gpt --partition gpu --time 01:00:00 --out train.sbatch
    partita models
    partita rendezvous --port 29400

A user error (unknown model, malformed cluster, a model that cannot fit, a bad plan file) prints one line
`partita: error: ...` and exits with code 2. `run` launches torchrun on `partita.runtime.train` in a subprocess:
the planner never imports the runtime (DESIGN.md layering).
"""
from __future__ import annotations

import argparse
import os
import sys

from partita import cli_args
from partita.costmodel.errors import PartitaError
from partita.runtime.launcher.child import run_forwarding_signals
from partita.runtime.launcher.flags import NODE_FLAGS, RECIPE_FLAGS, RUN_FLAGS, given_fields, to_argv
from partita.runtime.launcher.elastic import is_elastic
from partita.planner.plan import planset
from partita.runtime.launcher.inputs import job_environment_error, option_errors, output_errors, outputs_of


def _cmd_plan(args) -> int:
    from partita.planner.api import plan as make_plan
    from partita.planner.search import TrainConfig
    from partita.costmodel.hardware import parse_cluster

    cluster = parse_cluster(args.cluster)
    # no --dtype: TrainConfig's default, which planner.api resolves by device kind (api.default_dtype)
    train = TrainConfig(**given_fields(TrainConfig, args))  # no --dtype: TrainConfig's default (see above)
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
        p.predicted["resilience"] = _resilience(args, p, cluster).to_dict()
    if args.out:
        p.save(args.out)
    if args.json:
        sys.stdout.write(p.to_json())
    else:
        from partita.planner.plan.explain import print_plan
        print_plan(p)
        if args.mtbf:
            r = _resilience(args, p, cluster)
            print("\n" + r.line() + "".join(f"\n  assumed: {a}" for a in r.assumptions))
        if args.out:
            print(f"\nplan written to {args.out}")
    return 0


def _resilience(args, p, cluster):
    from partita.planner.estimate import resilience
    return resilience.price_plan(p, nodes=cluster.nodes, mtbf_s=args.mtbf * resilience.HOUR,
                                 storage_bw=_bandwidth(args), restart_s=args.restart_seconds, cluster=cluster,
                                 snapshot_bw=_gbs(args.snapshot_bandwidth))


def _bandwidth(args) -> float | None:
    return _gbs(args.checkpoint_bandwidth)


def _intervals(r) -> str:
    """The run's checkpoint flags: the full size's Young/Daly intervals with --mtbf (snapshots in memory where they
    lose less time than checkpoints alone), else a placeholder."""
    if r is None:
        return "--checkpoint-every N"
    snaps = r.snapshots
    return f"--checkpoint-every {r.every_steps}" + (
        f" --snapshot-every {snaps.every_steps}" if snaps is not None and snaps.lost_fraction < r.lost_fraction else "")


def _gbs(value: float | None) -> float | None:
    return None if value is None else value * 1e9


def _plan_set(args, cluster, train, space, progress) -> int:
    """`partita plan --nnodes MIN:MAX`: one plan per size, the table of what each lost node costs."""
    import json
    from partita.planner.api import plan_set
    if args.baselines or _sparse_from_args(args) is not None:
        raise PartitaError("--nnodes plans a dense model's sizes; leave out --baselines and the embedding flags")
    s = plan_set(args.model, cluster=cluster, train=train, nnodes=args.nnodes, progress=progress, space=space,
                 memory_headroom=args.memory_headroom, mtbf_h=args.mtbf, storage_bw=_bandwidth(args),
                 restart_s=args.restart_seconds, snapshot_bw=_gbs(args.snapshot_bandwidth))
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
        lo, hi = args.nnodes
        if lo < hi:
            from partita.runtime.launcher.elastic import NodeCount, refusal
            why = refusal(args.out, NodeCount(lo, hi))
            print(f"run it elastically on every node: partita run {args.out} --model {args.model} --nnodes {lo}:{hi} "
                  f"--rdzv-endpoint HOST:PORT --checkpoint-dir DIR {_intervals(s.full.resilience)}" if why is None
                  else f"not runnable elastically as a whole: {why}")
    return 0


def _sparse_from_args(args):
    """The recommendation-model flags as a SparseInputs, or None when none is given."""
    from partita.planner.sparse.inputs import SparseInputs
    given = given_fields(SparseInputs, args)
    return SparseInputs(**given) if given else None


def _space_from_args(args):
    """The what-if flags as a SearchSpace: each given flag fixes its choice, the rest stay searched (an unknown
    --sync mode is SearchSpace's one line, not an argparse usage block)."""
    from partita.planner.enumerate.space import SearchSpace
    return SearchSpace(**given_fields(SearchSpace, args))


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
    if is_elastic(nnodes):
        return _run_elastic(args, nnodes)
    if planset.is_plan_set(args.plan):
        args.plan = _plan_of_set(args.plan, nnodes)
    elif args.rescale_every is not None:
        raise PartitaError("--rescale-every is for elastic jobs (--nnodes MIN:MAX with a plan set)")
    _run_given_checks(args)
    plan = Plan.load(args.plan)  # validate before launching anything
    world = plan.mesh.world_size
    if world % nnodes:
        fits = ", ".join(str(n) for n in range(1, world + 1) if world % n == 0)
        raise PartitaError(f"the plan is for {world} ranks, which {nnodes} nodes cannot share equally "
                           f"(processes per node = world size / nnodes): use --nnodes {fits}")
    return _launch(args, world // nnodes, nnodes)


def _run_given_checks(args) -> None:
    """The values and outputs `partita run` refuses before the pre-flight (one line each)."""
    given = {"lr": 1e-3 if args.lr is None else args.lr, "seed": 0 if args.seed is None else args.seed}
    recipe = {name: getattr(args, name) for name in RECIPE_FLAGS}
    errors = option_errors(**given, **recipe) + output_errors(
        **outputs_of(args), inputs={"the plan": args.plan, "the --data file": args.data, "the --eval-data file": args.eval_data})
    if errors:  # before the pre-flight, before training: an output checked only at the end lost the run
        raise PartitaError(errors[0])


def _run_elastic(args, nnodes) -> int:
    """`partita run SET_DIR --nnodes MIN:MAX`: torchrun's elastic agent on this node, each round's workers on the
    set's plan for the nodes up (runtime.launcher.elastic). Refused in one line: no plan set, a size without a plan,
    no checkpoints to carry the run across sizes."""
    from partita.runtime.launcher import elastic
    if why := elastic.launch_refusal(args.plan, nnodes, args.checkpoint_dir, args.checkpoint_every):
        raise PartitaError(why)
    _run_given_checks(args)
    for note in elastic.slower_sizes(args.plan, nnodes):
        print(f"partita: {note}", file=sys.stderr, flush=True)
    if args.max_restarts is None:
        args.max_restarts = elastic.DEFAULT_RESTARTS
    return _launch(args, elastic.procs_per_node(args.plan, nnodes), nnodes)


def _launch(args, nproc: int, nnodes) -> int:
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
    from partita.export.slurm import slurm_flags as slurm_table
    from partita.planner.plan import Plan
    plan = Plan.load(args.plan)
    slurm_flags = [f.dest for f in slurm_table()]
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
    from partita.costmodel.calibrate import run
    return run(args)


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


def _cmd_rendezvous(args) -> int:
    from partita.runtime.launcher.store import serve
    return serve(args.port)


HANDLERS = {"plan": _cmd_plan, "explain": _cmd_explain, "compare": _cmd_compare, "run": _cmd_run,
            "export": _cmd_export, "calibrate": _cmd_calibrate, "models": _cmd_models, "rendezvous": _cmd_rendezvous}


def build_parser() -> argparse.ArgumentParser:
    return cli_args.build_parser(HANDLERS)


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
