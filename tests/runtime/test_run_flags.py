"""The run's flags are one table (runtime.launcher.flags): `partita run`, `python -m partita.runtime.train` and
`runtime.launch` take the same flags with the same help, the worker's defaults are RunOptions', and the
launcher rebuilds a worker's command line from the table (issue 43 step 5: no flag defined twice, no argparse
internals)."""
from __future__ import annotations

import argparse
import dataclasses

import pytest

from partita import cli
from partita.runtime import train
from partita.runtime.data import DTYPES
from partita.runtime.launcher.flags import NODE_FLAGS, RUN_FLAGS, names, to_argv
from partita.runtime.loop.options import DATA_DTYPES, DEFAULT_LOG_EVERY
from partita.runtime.loop.progress import DEFAULT_EVERY
from partita.runtime.loop.session import RunOptions


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for group in parser._action_groups for a in group._group_actions}  # read, never written


def _run_parser() -> argparse.ArgumentParser:
    return cli.build_parser()._subparsers._group_actions[0].choices["run"]


def test_the_flags_are_the_workers_options():
    """RUN_FLAGS is generated from RunOptions: a flag per field with its default and help, but the API's own."""
    fields = {f.name: f for f in dataclasses.fields(RunOptions)}
    assert [f.dest for f in RUN_FLAGS] == [n for n, f in fields.items() if "no_flag" not in f.metadata]
    for flag in RUN_FLAGS:
        assert (flag.default, flag.help) == (fields[flag.dest].default, fields[flag.dest].metadata["help"])
    assert {n for n, f in fields.items() if "no_flag" in f.metadata} == {"return_model", "print_report", "memory_trace"}
    assert DATA_DTYPES == tuple(DTYPES) and DEFAULT_LOG_EVERY == DEFAULT_EVERY


def test_both_entry_points_take_every_flag_with_the_same_help():
    ours, workers = _options(_run_parser()), _options(train.build_parser())
    for flag in RUN_FLAGS + NODE_FLAGS:
        assert ours[flag.dest].help == workers[flag.dest].help == flag.help, flag.dest
        assert ours[flag.dest].default in (None, False), flag.dest  # partita run forwards only what was given
        expected = flag.default if flag in RUN_FLAGS or flag.type is None else None
        assert workers[flag.dest].default == expected, flag.dest
    assert set(train.LAUNCHER_FLAGS) == names(NODE_FLAGS) | {"nproc_per_node"}


@pytest.mark.parametrize("argv", [
    [],
    ["--steps", "3", "--verify", "--lr", "0.01", "--seed", "7", "--data-dtype", "uint32", "--keep", "2",
     "--checkpoint-dir", "ckpt", "--checkpoint-every", "1", "--resume", "--sync-batchnorm", "--log-every", "0",
     "--losses-out", "o.json", "--tensorboard", "tb", "--data", "t.bin", "--max-restarts", "1",
     "--weight-decay", "0.1", "--warmup-steps", "2", "--lr-decay", "cosine", "--min-lr-ratio", "0.05",
     "--clip-grad-norm", "1.0", "--save-final", "w.pt"],
])
def test_what_partita_run_forwards_parses_to_what_was_given(argv):
    given = _run_parser().parse_args(["p.json", "--model", "tiny-gpt", *argv])
    forwarded = to_argv(given, RUN_FLAGS)
    assert sorted(forwarded) == sorted(argv)  # nothing the user did not give
    worker = train.build_parser().parse_args(["p.json", "--model", "tiny-gpt", *forwarded])
    for flag in RUN_FLAGS:
        expected = getattr(given, flag.dest)
        assert getattr(worker, flag.dest) == (flag.default if expected is None else expected), flag.dest
    again = train.build_parser().parse_args(["p.json", "--model", "tiny-gpt", *to_argv(worker, RUN_FLAGS)])
    assert vars(again) == vars(worker)  # the launcher's rebuilt worker command is the same run


def test_the_api_refuses_a_flag_the_worker_does_not_take(tmp_path):
    from partita.runtime.api import launch
    with pytest.raises(TypeError, match="runtime.train does not take: colour"):
        launch(tmp_path / "p.json", "tiny-gpt", 1, colour="red")


def test_export_to_slurm_takes_the_runs_flags_and_its_own_from_slurm_options():
    """`partita export --to slurm` restates no flag: the run's (--model, --steps, --data, checkpoints, restarts)
    come from the same table, with the same help, and the others are generated from SlurmOptions' fields."""
    from partita.export.slurm import RUN_FIELDS, SlurmOptions
    export = _options(cli.build_parser()._subparsers._group_actions[0].choices["export"])
    run = _options(_run_parser())
    for dest in ("model", *RUN_FIELDS):
        assert export[dest].help == run[dest].help, dest
    assert not export["model"].required and run["model"].required  # other export targets take no model
    for field in dataclasses.fields(SlurmOptions):
        if field.name not in ("model", *RUN_FIELDS):
            assert export[field.name].help == field.metadata["help"] and export[field.name].default is None
    assert {f.name for f in dataclasses.fields(SlurmOptions)} <= set(export)


def test_a_generated_flag_needs_help_and_a_type_the_command_line_can_say():
    from partita.runtime.launcher.flags import dataclass_flags

    @dataclasses.dataclass
    class Options:
        nodes: int | None = dataclasses.field(default=None, metadata={"help": "nodes", "metavar": "N"})
        fast: bool = dataclasses.field(default=False, metadata={"help": "go fast"})

    nodes, fast = dataclass_flags(Options)
    assert (nodes.option, nodes.type, nodes.default, nodes.metavar) == ("--nodes", int, None, "N")
    assert fast.type is None and fast.default is False  # a switch

    @dataclasses.dataclass
    class Undocumented:
        nodes: int = 1
    with pytest.raises(TypeError, match="Undocumented.nodes has no help"):
        dataclass_flags(Undocumented)

    @dataclasses.dataclass
    class Listed:
        sizes: list = dataclasses.field(default_factory=list, metadata={"help": "sizes"})
    with pytest.raises(TypeError, match="no flag form"):
        dataclass_flags(Listed)


def test_partita_plans_flags_are_generated_from_train_config_and_search_space():
    """Every TrainConfig and SearchSpace field is a `partita plan` flag with its metadata's help, or says why it is
    not one; SearchSpace's flags are exactly the choices a user fixes (FIXABLE); and what the flags give builds
    the same configuration a hand-written call does."""
    from partita.planner.enumerate.config import FIXABLE, SearchSpace, TrainConfig
    from partita.planner.sparse.inputs import SparseInputs
    from partita.runtime.launcher.flags import given_fields
    plan = _options(cli.build_parser()._subparsers._group_actions[0].choices["plan"])
    for cls in (TrainConfig, SearchSpace, SparseInputs):
        for field in dataclasses.fields(cls):
            assert ("help" in field.metadata) != ("no_flag" in field.metadata), f"{cls.__name__}.{field.name}"
            if "help" in field.metadata:
                action = plan[field.metadata.get("dest", field.name)]
                assert action.help == field.metadata["help"] and action.default in (None, False)
    assert {f.name for f in dataclasses.fields(SearchSpace) if "help" in f.metadata} == set(FIXABLE)

    args = cli.build_parser().parse_args(
        ["plan", "--model", "tiny-gpt", "--cluster", "4xcpu", "--global-batch", "8", "--seq", "16", "--tp", "2",
         "--recompute", "none,full", "--offload", "off", "--sequence-parallel", "on", "--sync", "synchronous,diloco",
         "--sync-allow-any-every", "--schedule", "GPipe", "--stage-layers", "1,1"])
    assert TrainConfig(**given_fields(TrainConfig, args)) == TrainConfig(global_batch=8, seq_len=16, schedule="GPipe")
    assert SearchSpace(**given_fields(SearchSpace, args)) == SearchSpace(
        tp=2, recompute=("none", "full"), offload=False, sequence_parallel=True, sync=("synchronous", "diloco"),
        sync_allow_any_every=True, stage_layers=(1, 1))
    bare = cli.build_parser().parse_args(["plan", "--model", "m", "--cluster", "4xcpu", "--global-batch", "8"])
    assert SearchSpace(**given_fields(SearchSpace, bare)) == SearchSpace() and given_fields(SparseInputs, bare) == {}
    rec = cli.build_parser().parse_args(["plan", "--model", "m", "--cluster", "4xcpu", "--global-batch", "8",
                                         "--optimizer", "sgd", "--sparse-optimizer", "adam", "--zipf", "1.05",
                                         "--embedding-costs", "torchrec", "--embedding-sharding", "*=table_wise"])
    assert TrainConfig(**given_fields(TrainConfig, rec)).optimizer == "sgd"  # the dense part's, not the tables'
    assert SparseInputs(**given_fields(SparseInputs, rec)) == SparseInputs(
        optimizer="adam", zipf=1.05, pricing="torchrec", fixed="*=table_wise")
