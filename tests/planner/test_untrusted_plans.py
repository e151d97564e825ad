"""A plan file is untrusted input for every command that reads one (issue 47 items 11, 13 and the fuzz test).

- Item 11: the loader looks at what the file is before reading it: /dev/zero, a FIFO or a directory is one line
  (it used to grow until MemoryError, or wait forever for a FIFO's writer), and an oversize file is refused
  without being read.
- Item 13: explain, compare and export read the sections the runtime does not (predicted, solver, baselines,
  model config): a wrong type there is one line when the plan is loaded, not a traceback in the command.
- The fuzz test: 240 mutations of three real plans made by the planner (keys deleted, wrong types, huge, negative and
  NaN-like numbers, hostile strings, deep nesting, truncation, bytes that are not UTF-8 ...) go through `partita
  explain`, `compare`, `export` (all four targets) and `run` up to its launch (the pre-flight `runtime.train --check`
  it runs): each ends with exit code 0 or 2, a refusal is one line, nothing prints a traceback, and nothing is
  written outside the export's output file.

The fuzz cases run in one driver process (this file run as a script) calling the CLI's `main` in-process; the
subprocess's timeout only guards against a hang.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib
import io
import json
import os
import random
import subprocess
import sys
import traceback
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


# ---- item 11: what the file is, before reading it ------------------------------------------------------------

def _explain_in_subprocess(path: Path) -> subprocess.CompletedProcess:
    """`partita explain PATH` in a process allowed 2 GiB of address space beyond what its imports took, so a
    loader that reads an endless file fails with MemoryError rather than filling the machine; the timeout
    guards a loader that waits on a FIFO."""
    code = ("import os, resource, sys\n"
            "from partita import cli\n"
            "size = int(open('/proc/self/statm').read().split()[0]) * os.sysconf('SC_PAGE_SIZE')\n"
            "resource.setrlimit(resource.RLIMIT_AS, (size + 2**31, resource.getrlimit(resource.RLIMIT_AS)[1]))\n"
            "sys.exit(cli.main(['explain', sys.argv[1]]))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    try:
        return subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=60,
                              env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"explain {path} still reading after 60 s")


def test_devices_and_fifos_are_refused_before_a_byte_is_read(tmp_path):
    fifo = tmp_path / "plan.fifo"
    os.mkfifo(fifo)
    for path, kind in ((Path("/dev/zero"), "a character device"), (fifo, "a FIFO (named pipe)")):
        r = _explain_in_subprocess(path)
        assert r.returncode == 2, (path, r.returncode, r.stderr[-2000:])
        assert r.stderr.strip() == (f"partita: error: plan {str(path)!r} is {kind}, not a file: give the plan file "
                                    "`partita plan --out` wrote"), r.stderr[-2000:]


def test_a_directory_and_an_oversize_file_are_one_line(tmp_path, capsys):
    from partita import cli
    from partita.planner.plan import MAX_PLAN_BYTES
    big = tmp_path / "big.json"
    with open(big, "wb") as f:  # sparse: no disk, and never read
        f.truncate(MAX_PLAN_BYTES + 1)
    # explain reads a directory as a plan set (planner.plan.planset); compare wants two plan files
    for command, path, needle in (("explain", tmp_path, "holds no plan file nodes-N.json"),
                                  ("compare", tmp_path, "is a directory, not a file"),
                                  ("explain", big, f"is larger than any plan (more than {MAX_PLAN_BYTES:,} bytes)")):
        assert cli.main([command, str(path)] + ([str(path)] if command == "compare" else [])) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("partita: error: ") and needle in err, err


def test_an_oversize_file_is_refused_without_reading_it(tmp_path, monkeypatch):
    """The size is taken from the open descriptor before any read (a read of the sparse file would take
    256 MiB of memory first)."""
    plan_module = importlib.import_module("partita.planner.plan")  # (partita.planner.plan is also a function)
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(plan_module.MAX_PLAN_BYTES + 1)
    reads = []
    real_fdopen = os.fdopen
    monkeypatch.setattr(plan_module.os, "fdopen", lambda *a, **k: reads.append(a) or real_fdopen(*a, **k))
    with pytest.raises(plan_module.PlanError, match="is larger than any plan"):
        plan_module.Plan.load(big)
    assert reads == []


# ---- item 13: the sections explain, compare and export read -------------------------------------------------

DLRM = "dlrm:tables=4,rows=64-80-96-50,dim=8,bottom=16-8,top=16-1,dense=4,pooling=2"
MODELS = {"dp2": "tiny-gpt", "pp2tp2": "tiny-gpt", "dlrm": DLRM}
"""The model each base plan was made for (`partita run --model`, `export --to slurm --model`)."""


@pytest.fixture(scope="module")
def base_plans() -> dict[str, dict]:
    """Real plans made by the planner: tiny-gpt over dp=2 with its baselines, tiny-gpt over pp=2 x tp=2 (stages,
    placements, a pipeline schedule), and a small DLRM's (an embeddings section)."""
    from partita.planner.api import plan_search
    from partita.planner.sparse.rec_plan import SparseInputs
    from partita.planner.enumerate.space import SearchSpace, TrainConfig
    dp = plan_search("tiny-gpt", cluster="2xcpu", train=TrainConfig(global_batch=4), baselines=True)[1]
    pp = plan_search("tiny-gpt", cluster="4xcpu", train=TrainConfig(global_batch=4),
                     space=SearchSpace(pp=(2,), tp=(2,)))[1]
    rec = plan_search(DLRM, cluster="2xcpu", train=TrainConfig(global_batch=16),
                      sparse=SparseInputs(fixed="embeddings.cat_2=column_wise:2", optimizer="sgd"))[1]
    return {name: json.loads(p.to_json()) for name, p in (("dp2", dp), ("pp2tp2", pp), ("dlrm", rec))}


def _commands(path: Path, other: Path, out: Path, model: str = "tiny-gpt") -> list[list[str]]:
    p = str(path)
    return [["explain", p], ["compare", p, str(other)], ["export", p, "--to", "megatron"],
            ["export", p, "--to", "torchtitan", "--out", str(out.with_suffix(".toml"))],
            ["export", p, "--to", "slurm", "--model", model, "--out", str(out.with_suffix(".sbatch"))],
            ["export", p, "--to", "torchrec"]]


@pytest.mark.parametrize("base, edit, needle", [
    ("dp2", lambda d: d["predicted"].update(step_time_s="0.1"), "predicted.step_time_s must be a number more than 0"),
    ("dp2", lambda d: d["predicted"].update(step_time_s=0), "predicted.step_time_s must be a number more than 0"),
    ("dp2", lambda d: d["predicted"].update(mfu=1e200), "predicted.mfu must be a number from 0 to 1e+30"),
    ("dp2", lambda d: d["predicted"].update(peak_memory_bytes=10**400), "predicted.peak_memory_bytes must be a number"),
    ("dp2", lambda d: d["predicted"]["breakdown"].update(compute_s=[1]), "predicted.breakdown.compute_s must be a number"),
    ("dp2", lambda d: d["predicted"]["memory_per_stage"][0].pop("total"), "predicted.memory_per_stage[0] has no total"),
    ("dp2", lambda d: d["predicted"].update(assumptions="x"), "predicted.assumptions must be a JSON list"),
    ("pp2tp2", lambda d: d["predicted"].update(memory_capacity_per_stage=[1]), None),  # fewer than the stages
    ("dp2", lambda d: d["solver"].update(wall_time_s="1"), "solver.wall_time_s must be a number"),
    ("dp2", lambda d: d["solver"].update(fixed=[1]), "solver.fixed must be a JSON object"),
    ("dp2", lambda d: d["baselines"][0].update(predicted=5), "baselines[0].predicted must be a JSON object"),
    ("dp2", lambda d: d["baselines"][0].pop("mesh"), "baselines[0].mesh must be a JSON object"),
    ("dp2", lambda d: d["baselines"][0].update(name=7), "baselines[0].name must be a string"),
    ("dp2", lambda d: d["model"]["config"].update(seq="x"), "model.config.seq must be a whole number"),
    ("dp2", lambda d: d["model"]["config"].update(layers=[]), "model.config.layers must be a whole number"),
    ("dp2", lambda d: d["model"].update(parameters=-1), "model.parameters must be a whole number from 0"),
    ("pp2tp2", lambda d: d["cluster"].update(stage_groups=["a"]), "cluster.stage_groups names 1 group(s) for 2"),
    ("pp2tp2", lambda d: d.update(predicted={"peak_memory_bytes": 1}), None),  # a hand-written plan's: shown
    ("dlrm", lambda d: d["embeddings"]["predicted"]["per_rank"].update(time_s=[]),
     "embeddings.predicted.per_rank.time_s must list 2 items, got 0"),
    ("dlrm", lambda d: d["embeddings"]["solver"].update(mip_gap=None), "embeddings.solver.mip_gap must be a number"),
    ("dlrm", lambda d: d["embeddings"]["tables"][0]["predicted"].update(comm_s="1"),
     "embeddings.tables[0].predicted.comm_s must be a number"),
    ("dlrm", lambda d: d["embeddings"]["tables"][0].update(name="[/]"), None),  # a name, shown as it is
])
def test_bad_descriptive_fields_are_one_line_in_every_command(base_plans, tmp_path, capsys, base, edit, needle):
    """Each of these made `explain`, `compare` or `export` end in a traceback (KeyError, TypeError, ValueError,
    ZeroDivisionError, OverflowError, IndexError) once Plan.from_dict had let the field through; where
    `needle` is None the field is one a plan may leave out, and every command shows the plan."""
    from partita import cli
    plan = copy.deepcopy(base_plans[base])
    edit(plan)
    path, other = tmp_path / "p.json", tmp_path / "base.json"
    path.write_text(json.dumps(plan))
    other.write_text(json.dumps(base_plans[base]))
    for argv in _commands(path, other, tmp_path / "out"):
        code = cli.main(argv)
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        if needle is None:  # as the unedited plan does (export --to torchrec refuses a plan without tables)
            assert code == cli.main([str(other) if a == str(path) else a for a in argv]), (argv, captured.err[-2000:])
            capsys.readouterr()
            continue
        assert code == 2, (argv, captured.out[-500:], captured.err[-2000:])
        assert captured.err.count("\n") == 1 and captured.err.startswith("partita: error: "), captured.err
        assert needle in captured.err, captured.err


@pytest.mark.parametrize("text", ["[/]", "[bold red]x", ":thumbs_up:", "blocks.\u00b2", "\ud800"])
def test_plan_text_is_never_read_as_markup_or_written_unencodable(base_plans, tmp_path, capsys, text):
    """Module, baseline and stage-group names reach rich tables: "[/]" raised MarkupError there; a superscript
    digit ending a module name passed str.isdigit and failed int(); a lone surrogate could not be printed.
    Printable names are shown as they are; a surrogate is refused in one line."""
    from partita import cli
    plan = copy.deepcopy(base_plans["dp2"])
    plan["baselines"][0]["name"] = text
    plan["predicted"]["breakdown"][text + "_s"] = 0.001
    plan["stages"][0]["modules"].append(text)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(plan))
    for argv in (["explain", str(path)], ["compare", str(path), str(path)]):
        code = cli.main(argv)
        captured = capsys.readouterr()
        if text == "\ud800":
            assert code == 2 and "holds a control character" in captured.err, captured.err
        else:
            assert code == 0, captured.err
            assert argv[0] == "compare" or text in captured.out  # (compare's narrow columns may fold it)


# ---- the fuzz test -------------------------------------------------------------------------------------------

WRONG_TYPES = [None, True, False, 0, 1, -1, 2.5, "", "x", "2", [], [1], {}, {"x": 1}]
HUGE = [2**31 - 1, 2**31, 2**40, 2**63, 2**64, 10**30, 10**100, 2**1000, 1e300]
NEGATIVE = [-1, -2**31, -1e-9, -0.0, -1e300, -(2**64)]
NAN_LIKE = ["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 5000]
CONTROL = ["\n", "\x1b[31m", "\u202e", "\x00", "\r", "\u2028", "\x7f", "\t", "\ud800", "\x9b"]
HOSTILE = ["[/]", "[link=file:///etc/passwd]x[/link]", ":smile:", "%s%n", "{0}", "${HOME}", "$(touch PWNED)",
           "`touch PWNED`", "'; touch PWNED; '", "\\", '"', "blocks.\u00b2", "blocks.\u0661", "\u00e9" * 3,
           "x" * 100_000, "../../../../etc/passwd", "-rf", "--help", " ", "a b"]
TOKEN = "@@partita-token@@"


def _paths(node, prefix=()):
    """Every path (a tuple of keys and indices) to a value inside `node`, the root excluded."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for k, v in items:
        yield prefix + (k,)
        yield from _paths(v, prefix + (k,))


def _set(root, path, value):
    node = root
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value


def _get(root, path):
    for k in path:
        root = root[k]
    return root


def _nested(depth: int, rng: random.Random):
    value: object = 1
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"x": value}
    return value


def _structural(base: dict, rng: random.Random, op: str) -> bytes:
    plan = copy.deepcopy(base)
    path = rng.choice(list(_paths(plan)))
    parent, key = _get(plan, path[:-1]), path[-1]
    token = None
    if op == "delete":
        del parent[key]
    elif op == "wrong_type":
        parent[key] = copy.deepcopy(rng.choice(WRONG_TYPES))
    elif op == "huge":
        parent[key] = rng.choice(HUGE)
    elif op == "negative":
        parent[key] = rng.choice(NEGATIVE)
    elif op == "nan_like":
        parent[key], token = TOKEN, rng.choice(NAN_LIKE)
    elif op == "control":
        old = parent[key]
        bad = rng.choice(CONTROL)
        parent[key] = (old[:len(old) // 2] + bad + old[len(old) // 2:]) if isinstance(old, str) else "x" + bad
    elif op == "hostile":
        parent[key] = rng.choice(HOSTILE)
    elif op == "nesting":
        depth = rng.choice([33, 100, 500, 100_000])
        if depth < 1000:
            parent[key] = _nested(depth, rng)
        else:  # deeper than json writes or Python reads: as text
            parent[key], token = TOKEN, "[" * depth + "]" * depth
    elif op == "swap":
        parent[key] = copy.deepcopy(_get(plan, rng.choice(list(_paths(base)))))
    elif op == "key":
        holder_paths = [p for p in _paths(plan) if isinstance(_get(plan, p), dict) and _get(plan, p)]
        holder = _get(plan, rng.choice(holder_paths)) if holder_paths else plan
        old = rng.choice(list(holder))
        holder[rng.choice(HOSTILE + CONTROL)] = holder.pop(old)
    elif op == "long_list":
        size = len(json.dumps(parent[key]))
        parent[key] = [copy.deepcopy(parent[key])] * min(rng.choice([2, 1000, 20_000]), max(2, 2_000_000 // size))
    text = json.dumps(plan)
    if token is not None:
        text = text.replace(json.dumps(TOKEN), token, 1)
    return text.encode("utf-8", "surrogatepass")


def _textual(base: dict, rng: random.Random, op: str) -> bytes:
    raw = json.dumps(base, indent=rng.choice([None, 2])).encode()
    at = rng.randrange(len(raw))
    if op == "truncate":
        return raw[:at]
    if op == "bad_bytes":
        return raw[:at] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80\x80", b"\xf8\x88\x80\x80\x80"]) \
            + raw[at:]
    if op == "flip":
        out = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out)
    if op == "surrogate_escape":  # JSON escapes of what no text may hold, in the model's name
        return raw.replace(json.dumps(base["model"]["name"]).encode(),
                           rng.choice([b'"\\ud800"', b'"\\udfff x"', b'"a\\u0000b"']), 1)
    if op == "whole":
        return rng.choice([b"", b" \n", b"null", b"[]", b"{}", b'"plan"', b"1", raw + raw, raw + b"// x",
                           b"\xef\xbb\xbf" + raw, json.dumps(base).encode("utf-16"), b"\x00" * 64])
    raise AssertionError(op)


STRUCTURAL = ("delete", "wrong_type", "huge", "negative", "nan_like", "control", "hostile", "nesting", "swap", "key",
              "long_list")
TEXTUAL = ("truncate", "bad_bytes", "flip", "surrogate_escape", "whole")


def mutants(bases: dict[str, dict], per_op: int = 15, seed: int = 47) -> list[tuple[str, str, bytes]]:
    """(name, base name, bytes) of deterministic mutations: per_op of each operator, over the bases in turn."""
    rng = random.Random(seed)
    names = sorted(bases)
    out = []
    for op in STRUCTURAL + TEXTUAL:
        for i in range(per_op):
            base = names[i % len(names)]
            make = _structural if op in STRUCTURAL else _textual
            out.append((f"{op}-{i:02d}-{base}", base, make(bases[base], rng, op)))
    return out


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


def test_mutated_plans_are_refused_in_one_line_by_every_command(base_plans, tmp_path):
    cases = mutants(base_plans)
    assert len(cases) >= 200
    plans, out, work = tmp_path / "plans", tmp_path / "out", tmp_path / "work"
    for d in (plans, out, work, work / "home", work / "tmp"):
        d.mkdir()
    for name, base in base_plans.items():
        (plans / f"base-{name}.json").write_text(json.dumps(base))
    listed = []
    for name, base, data in cases:
        (plans / f"{name}.json").write_bytes(data)
        listed.append({"name": name, "plan": str(plans / f"{name}.json"), "other": str(plans / f"base-{base}.json"),
                       "out": str(out / name), "model": MODELS[base]})
    (tmp_path / "cases.json").write_text(json.dumps(listed))
    before = _tree(tmp_path)
    # torch's own compile cache: `partita run`'s launcher imports torch._dynamo (runtime.launcher.fork.preload),
    # which makes it in TMPDIR unless TORCHINDUCTOR_CACHE_DIR names one -- and torch sets that variable in the
    # process that first asks, so whether this test saw the directory depended on what ran before it in its worker
    inductor = work / "torch-cache"
    env = {**os.environ, "HOME": str(work / "home"), "TMPDIR": str(work / "tmp"), "OMP_NUM_THREADS": "1",
           "TORCHINDUCTOR_CACHE_DIR": str(inductor),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "PARTITA_FAULT"):
        env.pop(var, None)
    try:  # a hang guard only: the cases take about a minute
        r = subprocess.run([sys.executable, __file__, str(tmp_path / "cases.json")], cwd=work, env=env,
                           capture_output=True, text=True, timeout=1200)
    except subprocess.TimeoutExpired as e:
        started = [line for line in (e.stdout or b"").decode().splitlines() if line.startswith('{"start"')]
        pytest.fail(f"the fuzz driver hung at {started[-1:] or 'its start'}")
    assert r.returncode == 0, r.stderr[-3000:]
    results = [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"argv"')]
    assert len(results) == len(cases) * 7, r.stderr[-3000:]
    bad = []
    for res in results:
        err, code = res["stderr"], res["code"]
        if res["traceback"] or "Traceback" in err + res["stdout"] or code not in (0, 2) \
                or code == 2 and not (err.count("\n") == 1 and err.startswith("partita: error: ")):
            bad.append(res)
    assert not bad, "\n\n".join(f"{b['argv']}: exit {b['code']}\n{b['traceback'] or b['stderr'][-1500:]}"
                                for b in bad[:5]) + f"\n({len(bad)} of {len(results)} bad)"
    after = _tree(tmp_path)
    new = {p for p in after if p not in before and not (tmp_path / p).is_relative_to(inductor)}
    changed = {p for p in before if after.get(p) != before[p]}
    assert not changed, f"inputs changed: {sorted(changed)[:10]}"
    assert all(p.startswith("out/") or p == "out" for p in new), sorted(p for p in new if not p.startswith("out/"))
    written = {Path(p).name for p in new}
    exported = {Path(res["argv"][-1]).name for res in results if res["code"] == 0 and "--out" in res["argv"]}
    assert written == exported, (sorted(written ^ exported)[:10])
    refused = sum(res["code"] == 2 for res in results)
    assert 0 < refused < len(results)  # mutations that break the plan, and harmless ones that run as any plan does


# ---- the driver: run as a script, one process for every case ------------------------------------------------

def _call(fn, *args) -> tuple[int, str, str, str]:
    """fn(*args) with stdout and stderr captured: (exit code, stdout, stderr, traceback or "")."""
    out, err = io.StringIO(), io.StringIO()
    tb = ""
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = fn(*args)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 2
        except BaseException:  # noqa: BLE001 -- what the test looks for
            code, tb = -1, traceback.format_exc()
    return code, out.getvalue(), err.getvalue(), tb


def _drive(cases_file: str) -> None:
    """Every command on every case, in this process: `partita run` up to torchrun's agent, its launcher process
    (`runtime.train` with launcher flags, which runs the pre-flight checks first) called in-process as well."""
    from partita import cli
    from partita.runtime import api, train
    from partita.runtime.failure.stop import StopSignal

    def launcher(cmd, env):  # cli._cmd_run's run_forwarding_signals([python, -m, runtime.train, ...])
        assert cmd[1:3] == ["-m", "partita.runtime.train"], cmd
        try:
            return train.main(cmd[3:])
        finally:
            if StopSignal.current is not None:
                StopSignal.current.restore()

    cli.run_forwarding_signals = launcher
    api.agent_main = lambda args, argv: 0  # the launch itself: the pre-flight passed
    for case in json.loads(Path(cases_file).read_text()):
        for argv in [*_commands(Path(case["plan"]), Path(case["other"]), Path(case["out"]), case["model"]),
                     ["run", case["plan"], "--model", case["model"], "--steps", "1"]]:
            print(json.dumps({"start": argv}), flush=True)
            code, out, err, tb = _call(cli.main, argv)
            print(json.dumps({"argv": argv, "code": code, "stdout": out[-2000:], "stderr": err, "traceback": tb},
                             ensure_ascii=True), flush=True)


if __name__ == "__main__":
    _drive(sys.argv[1])
