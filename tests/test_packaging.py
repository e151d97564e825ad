"""partita as a user installs it: the wheel (not an editable checkout) plans and runs, and pyproject declares
every package the product imports (issue 44, items 1 and 2)."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("costmodel", "planner", "runtime", "partita")
DISTRIBUTION = {"yaml": "pyyaml", "fbgemm_gpu": "fbgemm-gpu-cpu", "torchrec": "torchrec"}
"""Import names whose distribution is named otherwise (fbgemm_gpu: the CPU build the rec-cpu extra installs)."""
STATED_IN_COMMENTS = {"torchrec"}
"""Declared by the install commands pyproject's comment gives for the rec extra (torchrec's own fbgemm
dependency depends on the host), not by a requirement."""


def imported_packages() -> dict[str, set[str]]:
    """Top-level third-party packages the product's modules import, each with the files that import it."""
    found: dict[str, set[str]] = {}
    for folder in PRODUCT:
        for f in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(f.read_text())):
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "partita":
                        found.setdefault(top, set()).add(str(f.relative_to(ROOT)))
    return found


def _name(requirement: str) -> str:
    for stop in "<>=![; ":
        requirement = requirement.split(stop)[0]
    return requirement.strip().lower().replace("_", "-")


def test_every_imported_package_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {_name(r) for r in project["dependencies"]}
    declared |= {_name(r) for extra in project["optional-dependencies"].values() for r in extra}
    declared |= STATED_IN_COMMENTS
    missing = {pkg: sorted(files) for pkg, files in imported_packages().items()
               if DISTRIBUTION.get(pkg, pkg).replace("_", "-") not in declared}
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"
    # and the test extra is the sum of the others, so `pip install .[test]` runs this suite
    test = set(project["optional-dependencies"]["test"])
    assert "partita[hf,tensorboard,viz,rec-cpu]" in test


def test_a_plan_imports_no_cvxpy():
    """The stage program goes to HiGHS as a matrix: planning a transformer does not pay cvxpy's import."""
    code = ("import sys; from partita.planner.api import plan; from partita.planner.search import TrainConfig; "
            "plan('tiny-gpt', cluster='2xcpu', train=TrainConfig(global_batch=4)); "
            "print(sorted(m for m in ('cvxpy', 'scipy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def wheel_env(tmp_path_factory):
    """A fresh virtual environment with partita installed from its wheel, not editable. Its dependencies come
    from this environment's site-packages (a .pth line: no download), whose editable finder is not loaded
    (a .pth file inside a directory a .pth line adds is not read)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in PRODUCT:
        shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                            "-w", str(tmp / "dist"), "-q"], capture_output=True, text=True, timeout=300, cwd=tmp)
    assert built.returncode == 0, built.stderr
    wheel = next((tmp / "dist").glob("partita-*.whl"))
    env = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=120)
    python = env / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    installed = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q",
                                str(wheel)], capture_output=True, text=True, timeout=300)
    assert installed.returncode == 0, installed.stderr
    Path(purelib, "deps-from-dev-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return env, tmp


def test_the_wheel_ships_its_data_and_plans_and_runs(wheel_env):
    env, tmp = wheel_env
    work = tmp / "work"  # not the checkout: nothing may be imported from the source tree
    work.mkdir()
    python, partita = env / "bin" / "python", env / "bin" / "partita"
    run_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # the installed package captures for itself (not from the session's capture cache, made from the checkout)
    run_env.update(OMP_NUM_THREADS="1", PARTITA_CACHE_DIR="off", PATH=f"{env / 'bin'}:{run_env.get('PATH', '')}")
    where = subprocess.run([str(python), "-c", "import partita.costmodel as c; print(c.__file__)"],
                           capture_output=True, text=True, cwd=work, env=run_env, timeout=120)
    assert where.returncode == 0 and where.stdout.startswith(str(env)), (where.stdout, where.stderr)
    plan = subprocess.run([str(partita), "plan", "--model", "tiny-gpt", "--cluster", "2xcpu", "--global-batch", "4",
                           "--out", "plan.json"], capture_output=True, text=True, cwd=work, env=run_env, timeout=300)
    assert plan.returncode == 0, plan.stderr
    mesh = json.loads((work / "plan.json").read_text())["mesh"]
    assert mesh["pp"] * mesh["dp"] * mesh["tp"] == 2 and "predicted step" in plan.stdout
    run = subprocess.run([str(partita), "run", "plan.json", "--model", "tiny-gpt", "--steps", "2",
                          "--losses-out", "out.json"], capture_output=True, text=True, cwd=work, env=run_env,
                         timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    out = json.loads((work / "out.json").read_text())
    assert len(out["losses"]) == 2


def test_listing_and_explaining_import_no_torch(tmp_path):
    """`partita models` and `partita explain PLAN` print what they read without torch (issue 44: 5 s each,
    all of it torch's import)."""
    from partita.planner.api import plan
    from partita.planner.search import TrainConfig
    plan("tiny-gpt", cluster="2xcpu", train=TrainConfig(global_batch=4)).save(tmp_path / "p.json")
    for argv in (["models"], ["explain", str(tmp_path / "p.json")]):
        code = ("import sys; from partita.cli import main; code = main(sys.argv[1:]); "
                "sys.stderr.write(repr(sorted(m for m in ('torch', 'cvxpy') if m in sys.modules))); sys.exit(code)")
        out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120,
                             cwd=tmp_path)
        assert out.returncode == 0 and out.stderr.strip() == "[]", (argv, out.stderr[-2000:])
        assert out.stdout.strip()
