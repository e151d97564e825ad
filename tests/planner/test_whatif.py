"""What-if: `partita plan` flags (and planner.plan's SearchSpace / keywords) fix decisions and leave the
rest searched; a fixed configuration that cannot run is one line saying why, before any solving."""
import json
import subprocess
import sys

import pytest

import partita.planner as planner
from partita.costmodel.errors import InfeasibleError, PartitaError
from partita.cli import main
from partita.costmodel.hardware import parse_cluster
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture
from partita.planner.solve.milp import min_memory
from partita.planner.search import explain_infeasible, search
from partita.planner.enumerate.space import SearchSpace
from partita.planner.plan.schedules import SCHEDULES

MODEL = "gpt:layers=4,hidden=256,heads=8,seq=128,vocab=1000"
DEEP = "gpt:layers=8,hidden=256,heads=8,seq=128,vocab=1000"
PLAN = ["plan", "--model", MODEL, "--cluster", "8xA100-80GB", "--global-batch", "16"]


def plan_json(capsys, *flags, base=PLAN) -> dict:
    assert main([*base, "--json", *flags]) == 0
    out = capsys.readouterr().out
    return json.loads(out)  # stdout is the JSON object and nothing else


def layer_blocks(d: dict) -> list[dict]:
    return [b for b in d["blocks"] if b["fqn"].startswith("blocks.")]


@pytest.mark.parametrize("flags,check", [
    (["--tp", "2", "--pp", "2"], lambda d: (d["mesh"]["tp"], d["mesh"]["pp"], d["mesh"]["dp"]) == (2, 2, 2)),
    (["--dp", "8", "--micro-batch", "2"],
     lambda d: d["mesh"]["dp"] == 8 and d["schedule"]["micro_batch_size"] == 2),
    (["--zero", "3"], lambda d: d["zero_stage"] == 3 and d["mesh"]["dp"] > 1),
    (["--zero", "0", "--offload", "off"],
     lambda d: d["zero_stage"] == 0 and not any(b.get("offload_activations") or b.get("offload_states")
                                                 for b in d["blocks"])),
    (["--recompute", "full"], lambda d: {b["recompute"] for b in layer_blocks(d)} == {"full"}),
    (["--recompute", "none"], lambda d: {b["recompute"] for b in layer_blocks(d)} == {"none"}),
    (["--sequence-parallel", "on"],
     lambda d: d["mesh"]["tp"] > 1 and {b["sharding"] for b in layer_blocks(d)} == {"sequence"}),
    (["--pp", "2", "--virtual-stages", "2"],
     lambda d: d["schedule"]["name"] == "Interleaved1F1B" and d["schedule"]["virtual_stages"] == 2),
    (["--pp", "2", "--virtual-stages", "1"],  # one chunk: here GPipe, one micro-batch of 4 (faster than 1F1B's 2 of 2)
     lambda d: not SCHEDULES[d["schedule"]["name"]].virtual and d["schedule"]["virtual_stages"] == 1),
    (["--pp", "2", "--schedule", "GPipe"], lambda d: d["schedule"]["name"] == "GPipe"),
    (["--pp", "4", "--dp", "2", "--micro-batch", "4"],  # fewer micro-batches than stages: GPipe, with its bubble
     lambda d: (d["schedule"]["name"], d["schedule"]["num_microbatches"]) == ("GPipe", 2)),
    (["--tp", "8"], lambda d: d["mesh"]["tp"] == 8),  # priced as asked, though it never pays here
    (["--recompute", "none,full", "--full-recompute-layers", "3"],
     lambda d: sorted(b["recompute"] for b in layer_blocks(d)) == ["full"] * 3 + ["none"]),
    (["--recompute", "selective,full"], lambda d: {b["recompute"] for b in layer_blocks(d)} <= {"selective", "full"}),
    (["--kernels", "compiled"], lambda d: d["solver"]["fixed"] == {"kernels": "compiled"}
     and any(a.startswith("kernels: compiled") for a in d["predicted"]["assumptions"])),
])
def test_flags_fix_their_decision(capsys, flags, check):
    d = plan_json(capsys, *flags)
    assert check(d), (flags, d["mesh"], d["schedule"], d["zero_stage"])
    assert d["solver"]["fixed"]  # the plan records what the user fixed
    assert d["mesh"]["pp"] * d["mesh"]["dp"] * d["mesh"]["tp"] == 8


def test_an_unrestricted_plan_records_nothing_fixed(capsys):
    assert "fixed" not in plan_json(capsys)["solver"]


def test_the_report_names_what_the_user_fixed(capsys):
    assert main([*PLAN, "--tp", "2", "--recompute", "none,full", "--full-recompute-layers", "1"]) == 0
    out = capsys.readouterr().out
    assert "fixed   tp=2, recompute=none|full, full-recompute-layers=1 (the rest searched)" in out
    assert main(PLAN) == 0 and "\nfixed " not in capsys.readouterr().out


@pytest.mark.parametrize("flags,needle", [
    (["--tp", "16"], "tp=16 exceeds the cluster's 8 devices"),
    (["--tp", "3"], "tp=3 does not divide the 8 devices per node"),
    (["--tp", "2", "--pp", "2", "--dp", "4"], "tp x pp x dp = 2 x 2 x 4 = 16, but the cluster has 8 devices"),
    (["--tp", "4", "--pp", "4"], "tp x pp = 4 x 4 = 16 does not divide the 8 devices"),
    (["--pp", "8"], "pp=8 exceeds the model's 4 layers"),
    (["--dp", "3"], "dp=3 does not divide the 8 devices"),
    (["--dp", "4", "--micro-batch", "3"], "micro-batch 3 does not divide global batch / dp = 16 / 4 = 4"),
    (["--pp", "4", "--dp", "2", "--micro-batch", "4", "--schedule", "1F1B"],
     "1F1B needs at least as many microbatches as stages (2 < pp=4)"),
    (["--tp", "8", "--dp", "1", "--zero", "3"], "ZeRO-3 shards model states over data-parallel ranks and needs dp > 1"),
    (["--tp", "1", "--sequence-parallel", "on"], "sequence parallelism splits activations over tensor-parallel ranks"),
    (["--pp", "4", "--virtual-stages", "2"], "interleaving 2 model chunks per device over pp=4 stages needs at least"),
    (["--pp", "1", "--virtual-stages", "2"], "interleaved 1F1B needs pipeline stages (pp > 1)"),
    (["--virtual-stages", "4", "--schedule", "1F1B"], "which is the Interleaved1F1B schedule, not 1F1B"),
    (["--virtual-stages", "1", "--schedule", "Interleaved1F1B"], "needs more than one virtual stage"),
    (["--tp", "0"], "tp must be a positive integer, got 0"),
    (["--recompute", "none", "--full-recompute-layers", "2"], "recompute=none leaves out full: allow it"),
    (["--full-recompute-layers", "5"], "full-recompute-layers=5 but the model has 4 repeated layers"),
    (["--full-recompute-layers", "-1"], "full-recompute-layers must be a number of layers (0 or more), got -1"),
])
def test_an_impossible_fixed_config_is_one_line_before_any_solving(capsys, monkeypatch, flags, needle):
    import partita.planner.api  # noqa: F401  (loads the submodule read as planner.api)
    from partita import planner
    monkeypatch.setattr(planner.api, "search", lambda *a, **k: pytest.fail("searched an impossible config"))
    assert main([*PLAN, *flags]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("partita: error:") and needle in lines[0], captured.err
    assert captured.out == ""


@pytest.mark.parametrize("model,batch,flags,needle", [
    (DEEP, "12", ["--pp", "2", "--dp", "4", "--virtual-stages", "2"],
     "needs the number of micro-batches divisible by pp: 3 micro-batches over pp=2"),
    ("gpt:layers=4,hidden=256,heads=8,seq=100,vocab=1000", "16", ["--tp", "8", "--sequence-parallel", "on"],
     "100 is not divisible by tp=8"),
])
def test_impossible_interleaving_and_sequence_splits(capsys, model, batch, flags, needle):
    assert main(["plan", "--model", model, "--cluster", "8xA100-80GB", "--global-batch", batch, *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_an_unknown_recompute_policy_in_a_list_is_named(capsys):
    with pytest.raises(SystemExit) as e:
        main([*PLAN, "--recompute", "none,most"])
    assert e.value.code == 2 and "most is not a recompute policy" in capsys.readouterr().err


def test_a_fixed_number_of_fully_recomputed_layers_is_priced_and_kept():
    """Megatron-LM's --recompute-num-layers: on one fixed mesh each fully recomputed layer adds its
    forward again, so the step grows with their number, and the plan file keeps the count."""
    mesh = dict(tp=1, pp=1, dp=8, zero=0, micro_batch=2, recompute=("none", "full"))
    steps = []
    for n in (0, 2, 4):
        p = planner.plan(DEEP, cluster="8xA100-80GB", train=TRAIN, full_recompute_layers=n, **mesh)
        assert sum(b.recompute == "full" for b in p.blocks if b.fqn.startswith("blocks.")) == n
        assert p.solver["fixed"]["full_recompute_layers"] == n
        steps.append(p.predicted["step_time_s"])
    assert steps[0] < steps[1] < steps[2]


def test_a_tp_the_layers_cannot_take_is_named(capsys):
    assert main(["plan", "--model", "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256", "--cluster", "8xA100-80GB",
                 "--global-batch", "8", "--tp", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot be split over tp=8" in err[0], err


def test_a_fixed_config_that_does_not_fit_says_how_much_memory_it_needs():
    """In a subprocess, as a user sees it: exit code 2 and one line with the memory needed and available."""
    r = subprocess.run([sys.executable, "-m", "partita.cli", "plan", "--model", "megatron-7.5b", "--cluster",
                        "8xA100-80GB", "--global-batch", "16", "--tp", "1", "--pp", "1", "--zero", "0",
                        "--recompute", "none", "--offload", "off"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("partita: error: with tp=1, pp=1, zero=0, recompute=none, "
                                                   "offload=off fixed, no plan fits"), r.stderr
    assert "GiB per device" in lines[0] and "GiB usable" in lines[0] and "recompute=none, no offload" in lines[0]


TRAIN = planner.TrainConfig(global_batch=16)


def test_the_api_takes_the_same_restrictions_as_keywords_or_a_space():
    p = planner.plan(MODEL, cluster="8xA100-80GB", train=TRAIN, tp=2, pp=2, recompute="full")
    assert (p.mesh.tp, p.mesh.pp) == (2, 2)
    assert {b.recompute for b in p.blocks if b.fqn.startswith("blocks.")} == {"full"}
    p = planner.plan(MODEL, cluster="8xA100-80GB", train=TRAIN, space=SearchSpace(zero=(3,)), micro_batch=1)
    assert p.zero_stage == 3 and p.schedule.micro_batch_size == 1
    assert p.solver["fixed"] == {"zero": [3], "micro_batch": [1]}


def test_the_api_refuses_impossible_restrictions():
    with pytest.raises(PartitaError, match=r"tp x pp x dp = 2 x 2 x 4 = 16, but the cluster has 8 devices"):
        planner.plan(MODEL, cluster="8xA100-80GB", train=TRAIN, tp=2, pp=2, dp=4)
    with pytest.raises(InfeasibleError, match="no plan fits"):
        planner.plan("megatron-7.5b", cluster="8xA100-80GB", train=TRAIN, space=SearchSpace(tp=1, pp=1, zero=0))
    with pytest.raises(TypeError, match="the choices it fixes are tp, pp, dp, cp, ep"):
        planner.plan(MODEL, cluster="8xA100-80GB", train=TRAIN, sp=2)


def test_a_fixed_choice_that_rules_out_fitting_is_named_in_the_advice():
    """When the user's fixed choices rule out the usual remedies, the error says to free them, and freeing
    them does make it fit."""
    long_seq = "gpt:layers=8,hidden=2048,heads=16,seq=131072,vocab=1000"
    one = planner.TrainConfig(global_batch=1)
    with pytest.raises(InfeasibleError) as e:
        planner.plan(long_seq, cluster="1xA100-80GB", train=one, recompute="none", offload=False)
    msg = str(e.value)
    assert "activations dominate" in msg and "--recompute full" in msg and "--offload on" in msg
    assert planner.plan(long_seq, cluster="1xA100-80GB", train=one).predicted["step_time_s"] > 0
    with pytest.raises(InfeasibleError) as e:
        planner.plan("megatron-7.5b", cluster="8xA100-80GB", train=TRAIN, space=SearchSpace(tp=1, pp=1, zero=0))
    msg = str(e.value)
    assert "model states dominate" in msg and "--zero 3" in msg and "--recompute" not in msg
    assert planner.plan("megatron-7.5b", cluster="8xA100-80GB", train=TRAIN,
                        space=SearchSpace(tp=1, pp=1, zero=3)).zero_stage == 3


def test_an_infeasible_search_reports_the_least_memory_of_all_its_meshes():
    """The footprint in the error is the least any candidate needs, not the least among the first few tried
    (here ZeRO-3 data parallelism needs less than any pipeline, which a most-sharded-first cut missed; compiled
    selective layers cannot offload activations, so nothing fits)."""
    graph = capture(resolve_model("llama3-8b"), dtype="bf16")
    cluster = parse_cluster("1x4xA100-40GB")
    result = search(graph, cluster, planner.TrainConfig(global_batch=16, dtype="bf16"),
                    space=SearchSpace(tp=1, recompute="selective", kernels="compiled"), raise_infeasible=False)
    assert result.best is None
    need = min(min_memory(c.problem)[0] for c in result.candidates if c.formulation == "counts")
    msg = explain_infeasible(result)
    assert f"the smallest footprint needs {need / 2**30:.1f} GiB per device" in msg, msg
    assert len({(c.pp, c.zero) for c in result.candidates}) > 3  # several meshes to choose from


def test_search_space_fields_normalise_and_validate():
    s = SearchSpace(tp=2, dp=[4], zero=3, recompute="full", sequence_parallel=True, micro_batch=2, virtual_stages=1)
    assert (s.tp, s.dp, s.zero, s.recompute, s.sequence_parallel, s.micro_batch, s.virtual_stages) == \
        ((2,), (4,), (3,), ("full",), (True,), (2,), (1,))
    assert SearchSpace().fixed() == {} and SearchSpace(pp=None).pp is None
    assert SearchSpace(offload=False).fixed() == {"offload": False}
    for bad in (dict(tp=0), dict(pp=()), dict(zero=5), dict(recompute="some"), dict(sequence_parallel="on"),
                dict(offload="on"), dict(micro_batch=1.5)):
        with pytest.raises(PartitaError):
            SearchSpace(**bad)


def test_the_baseline_spaces_are_unchanged_by_the_new_fields():
    from partita.costmodel.hardware import parse_cluster
    from partita.planner.estimate.baselines import baseline_spaces
    for s in baseline_spaces(parse_cluster("4x8xA100-80GB")):
        assert s.dp is None and s.micro_batch is None and s.virtual_stages is None


def test_a_sequence_too_long_to_fit_names_context_parallelism_and_its_flag():
    """Issue 30 item 13: a 10M-token sequence does not fit 8 H100s even split over cp=8; the line shows the cp
    of the footprint it reports and names --cp among the remedies, not only 'context ... parallelism'."""
    r = subprocess.run([sys.executable, "-m", "partita.cli", "plan", "--model", "llama3-8b", "--cluster",
                        "8xH100-80GB", "--global-batch", "8", "--seq", "10000000", "--cp", "8"],
                       capture_output=True, text=True, timeout=300)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert "at pp=1, dp=1, tp=1, cp=8, ZeRO-" in lines[0] and "--cp N: each sequence split over N ranks" in lines[0]
    assert "but each H100-80GB has" in lines[0]  # not "a H100-80GB"


_ALL_CONV = '''
import torch, torch.nn as nn, torch.nn.functional as F

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, padding=1)
        self.blocks = nn.ModuleList(nn.Conv2d(16, 16, 3, padding=1) for _ in range(4))
        self.out = nn.Conv2d(16, 3, 1)

    def forward(self, x):
        x = self.stem(x)
        for b in self.blocks:
            x = x + F.relu(b(x))
        return self.out(x)

def loss(m, x, y):
    return F.mse_loss(m(x), y)

def model():
    return Net(), (torch.zeros(1, 3, 32, 32), torch.zeros(1, 3, 32, 32)), loss
'''


def test_tp_on_a_network_of_convolutions_says_convolutions_get_no_split(tmp_path, monkeypatch):
    """Issue 30 item 13: not 'their heads or hidden sizes are not divisible by it', which no --tp can fix."""
    (tmp_path / "partita_all_conv.py").write_text(_ALL_CONV)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PartitaError) as e:
        planner.plan("partita_all_conv:model", cluster="2xcpu", train=planner.TrainConfig(global_batch=8), tp=2)
    assert str(e.value).startswith("--tp 2: tensor parallelism splits Linear layers") and "divisible" not in str(e.value)
    assert "their conv2d operators get no tensor-parallel split in partita; use --tp 1" in str(e.value)
