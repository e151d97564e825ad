"""docs/own-models.md, "Train your own model on your own data", runs as written (issue 30): its commands -- a CNN
model factory carrying its loss, a map-style image dataset factory, 2 gloo ranks, --sync-batchnorm, --verify
-- are read from that page and run from a directory holding `examples/` (importable as the working
directory, no PYTHONPATH); so are the run with a training recipe and --save-final, and the Python lines that
load the saved weights into one process (issue 46); the resource list shown there loads."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = "# Train your own model on your own data"


def section() -> str:
    text = (ROOT / "docs" / "own-models.md").read_text()
    start = text.index(SECTION)
    end = text.find("\n# ", start + len(SECTION))
    return text[start:end if end >= 0 else len(text)]


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section(), re.S)


def commands(block: int = 0) -> list[list[str]]:
    """The `partita` commands of the page's `block`-th bash block (0: plan and run; 1: the run with a recipe)."""
    bash = blocks("bash")[block].replace("\\\n", " ")
    return [shlex.split(line)[1:] for line in bash.splitlines() if line.startswith("partita ")]


def partita(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "partita.cli", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=600, env={**env, "OMP_NUM_THREADS": "1"})


@pytest.fixture
def workdir(tmp_path) -> Path:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    return tmp_path


def test_the_readme_commands_train_a_cnn_on_an_image_dataset_with_verify(workdir):
    plan, run = commands()
    assert plan[0] == "plan" and run[0] == "run" and "--verify" in run and "--data" in run
    planned = partita(plan, workdir)
    assert planned.returncode == 0, planned.stderr[-3000:]
    assert "samples/s" in planned.stdout and "global batch 16 samples" in planned.stdout
    ran = partita(run, workdir)
    out = ran.stdout.splitlines()
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert out[0].startswith("partita run: examples.image_classifier:model on 2 rank(s)")
    assert "global batch 16 samples (dataset examples.image_classifier:dataset)" in out[0]
    progress = [ln for ln in out if re.match(r"step +\d+/8  loss", ln)]
    assert [ln.split()[1] for ln in progress] == ["1/8", "8/8"] and all("samples/s" in ln for ln in progress)
    assert out.index(progress[-1]) < out.index("step  loss          reference     |diff|")  # while training
    assert "verify: OK" in out and not any("BatchNorm" in ln for ln in out)  # synchronised: nothing to warn about
    losses = [float(ln.split()[1]) for ln in out if re.match(r" +\d+  \d\.\d{8}", ln)]
    assert len(losses) == 8 and losses[-1] < 0.75 * losses[0]  # it learns the stripes


@pytest.mark.slow
def test_without_sync_batchnorm_the_run_says_why_before_training_and_verify_fails(workdir):
    plan, run = commands()
    assert partita(plan, workdir).returncode == 0
    ran = partita([a for a in run if a != "--sync-batchnorm"] + ["--steps", "2"], workdir)
    out = ran.stdout.splitlines()
    assert ran.returncode == 1, ran.stdout[-3000:] + ran.stderr[-3000:]
    note = [i for i, ln in enumerate(out) if ln.startswith("note: the model has BatchNorm (5 layers)")]
    first_step = next(i for i, ln in enumerate(out) if ln.startswith("step 1/2"))
    assert note and note[0] < first_step and "--sync-batchnorm" in out[note[0]]
    assert "verify FAILED: losses" in ran.stdout


def test_the_recipe_run_and_loading_its_weights_run_as_written(workdir):
    (plan, _), (run,) = commands(0), commands(1)
    assert "--save-final" in run and "--clip-grad-norm" in run and "--verify" in run
    assert partita(plan, workdir).returncode == 0
    ran = partita(run, workdir)
    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    out = ran.stdout.splitlines()
    assert out[1] == ("recipe: SGD lr 0.1, weight decay 0.0001 (matrices only), warm-up 2 steps, cosine decay to "
                      "0.1 x lr at step 8, grad norm clipped at 1")
    assert "verify: OK" in out and any(ln.startswith("verify: grad norms before clipping") for ln in out)
    load = next(b for b in blocks("python") if "load_state_dict" in b)  # not the HF folder's block
    checksum = "\nprint(sum(float(p.double().sum()) for p in module.parameters()))"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    loaded = subprocess.run([sys.executable, "-c", load + checksum], cwd=workdir, capture_output=True, text=True,
                            timeout=300, env=env)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    said = next(ln for ln in out if ln.startswith("parameter checksum: ")).split()[2]
    assert float(loaded.stdout.split()[-1]) == pytest.approx(float(said), rel=1e-9)


def test_the_readme_resource_list_loads(tmp_path):
    from partita.costmodel.hardware.resources import load_resources
    (yaml_text,) = blocks("yaml")
    (tmp_path / "cluster.yaml").write_text(yaml_text)
    cluster = load_resources(str(tmp_path / "cluster.yaml"))
    assert [g.num_devices for g in cluster.groups] == [16, 4]
    assert cluster.groups[1].device.inter_node_bw == 1.25e9 and cluster.groups[1].device.name == "lab-a100"
