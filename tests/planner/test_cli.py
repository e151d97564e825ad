"""The partita command line: the plan report, --json fields scripts rely on, and one-line user errors."""
import json
import subprocess
import sys

import pytest

from partita.cli import main


def partita(*args):
    return subprocess.run([sys.executable, "-m", "partita.cli", *args], capture_output=True, text=True, timeout=300)


def test_plan_json_has_the_stable_fields(capsys):
    assert main(["plan", "--model", "gpt3-175b", "--cluster", "128x8xA100-80GB", "--global-batch", "1536",
                 "--seq", "2048", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["schema"] == "partita.plan/1"
    assert set(d["mesh"]) >= {"pp", "dp", "tp"} and d["mesh"]["pp"] * d["mesh"]["dp"] * d["mesh"]["tp"] == 1024
    assert set(d["schedule"]) >= {"name", "num_microbatches", "micro_batch_size"}
    assert set(d["predicted"]) >= {"step_time_s", "tokens_per_s", "tflops_per_device", "mfu", "peak_memory_bytes"}
    assert set(d["solver"]) >= {"status", "wall_time_s", "mip_gap"}
    assert d["schedule"]["num_microbatches"] * d["schedule"]["micro_batch_size"] * d["mesh"]["dp"] == 1536
    assert 0 < d["predicted"]["mfu"] < 1


def test_plan_report_and_explain_agree(tmp_path, capsys):
    out = tmp_path / "p.json"
    assert main(["plan", "--model", "tiny-gpt", "--cluster", "4xcpu", "--global-batch", "8", "--out", str(out)]) == 0
    report = capsys.readouterr().out
    assert "mesh" in report and "predicted" in report and "stage" in report
    assert main(["explain", str(out)]) == 0
    assert capsys.readouterr().out.strip() in report


@pytest.mark.parametrize("args,needle", [
    (["plan", "--model", "nope", "--cluster", "8xA100-80GB", "--global-batch", "8"], "unknown model 'nope'; presets:"),
    (["plan", "--model", "tiny-gpt", "--cluster", "8xZ9", "--global-batch", "8"], "unknown device 'Z9'; presets:"),
    (["plan", "--model", "llama3-8", "--cluster", "8xA100-80GB", "--global-batch", "8"],
     "unknown model 'llama3-8' (did you mean 'llama3-8b'?); presets:"),
    (["plan", "--model", "tiny-gpt", "--cluster", "8xh100-80gb", "--global-batch", "8"],
     "unknown device 'h100-80gb' (did you mean 'H100-80GB'?); presets:"),
    (["plan", "--model", "gpt:layers=2,hiden=64", "--cluster", "4xcpu", "--global-batch", "8"],
     "bad model parameter 'hiden=64' in 'gpt:layers=2,hiden=64' (did you mean 'hidden'?)"),
    (["plan", "--model", "tiny-gpt", "--cluster", "eight", "--global-batch", "8"], "malformed cluster 'eight'"),
    (["plan", "--model", "gpt:layers=2,hidden=64", "--cluster", "4xcpu", "--global-batch", "8"], "is missing"),
    (["plan", "--model", "gpt3-175b", "--cluster", "2xA100-80GB", "--global-batch", "8"], "no plan fits"),
    (["explain", "/nonexistent/plan.json"], "cannot read plan"),
])
def test_user_errors_are_one_line_with_exit_code_2(args, needle):
    r = partita(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("partita: error:") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_a_corrupt_plan_is_refused_without_running_anything(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "partita.plan/1", "mesh": {"pp": 1, "dp": 2, "tp": 1}}')
    r = partita("run", str(bad), "--model", "tiny-gpt", "--steps", "1")
    assert r.returncode == 2 and "missing" in r.stderr
    bad.write_text("__import__('os').system('echo pwned')")
    r = partita("explain", str(bad))
    assert r.returncode == 2 and "not valid JSON" in r.stderr and "pwned" not in r.stdout


def test_models_lists_the_presets(capsys):
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in ("tiny-gpt", "gpt3-175b", "llama3-405b", "megatron-1t"):
        assert name in out


def test_compare_shows_what_differs_and_where_the_time_goes(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    common = ["plan", "--model", "megatron-39b", "--cluster", "8x8xA100-80GB", "--global-batch", "512"]
    assert main([*common, "--out", str(a), "--json"]) == 0
    assert main([*common, "--schedule", "GPipe", "--out", str(b), "--json"]) == 0
    capsys.readouterr()
    assert main(["compare", str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert "mesh (pp x dp x tp)" in out and "where the time goes" in out and "compute" in out
    assert "is predicted" in out and "faster" in out


def test_compare_gives_no_ratio_for_plans_of_different_jobs():
    """A step of a 4-layer model is not a step of a 2-layer one, nor a step of 16 samples one of 8 (#46)."""
    from partita import planner
    from partita.report.compare import verdict

    def small_plan(model: str, batch: int, cluster: str = "2xcpu"):
        return planner.plan(model, cluster=cluster, train=planner.TrainConfig(global_batch=batch))

    base = small_plan("gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256", 8)
    other_cluster = small_plan("gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256", 8, cluster="4xcpu")
    assert "x faster" in verdict(base, other_cluster)  # the same job on another cluster: comparable
    deeper = small_plan("gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256", 8)
    assert verdict(base, deeper) == ("not compared: the plans train different jobs (model differs), so a step of "
                                     "one is not a step of the other")
    bigger = small_plan("gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256", 16)
    assert "(global batch differs)" in verdict(base, bigger)


def test_plan_json_stdout_is_only_the_json_object():
    """In a fresh process (where a solver could print its banner at the C level, as highspy 1.16 does on
    the first solve), `--json` writes the JSON object and nothing else to stdout."""
    r = partita("plan", "--model", "tiny-gpt", "--cluster", "2xcpu", "--global-batch", "4", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["schema"] == "partita.plan/1" and d["mesh"]["pp"] * d["mesh"]["dp"] * d["mesh"]["tp"] == 2


def test_models_lists_the_cnn_presets_too(capsys):
    """Issue 30 item 14: `partita models` omitted the resnet presets; each listed name resolves, at its depth."""
    from partita.costmodel.models import resolve_model
    from partita.costmodel.models.cnn import CNN_PRESETS
    assert main(["models"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines() if line.strip()}
    for name in CNN_PRESETS:
        assert name in rows and resolve_model(name).name == name
    assert rows["resnet50"][1] == "50" and rows["tiny-resnet"][1] == "18"


def test_the_plan_header_counts_in_words_that_fit(capsys):
    """Issue 30 item 14: "1 micro-batches of 8" and, for a CNN, "global batch 8, seq None"."""
    assert main(["plan", "--model", "tiny-resnet", "--cluster", "2xcpu", "--global-batch", "8", "--dp", "2",
                 "--micro-batch", "4"]) == 0
    out = capsys.readouterr().out
    assert "  train        global batch 8 samples, fp32, adam" in out and "seq None" not in out
    assert "1F1B, 1 micro-batch of 4" in out and "micro-batches of" not in out
