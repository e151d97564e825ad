"""`partita export`: a plan as a SLURM batch script, Megatron-LM arguments or torchtitan config overrides.

Each output is parsed back (argparse with Megatron-LM's flag names, tomllib, bash) and checked against the
plan's own numbers, so a broken mapping fails here rather than on a cluster."""
import argparse
import dataclasses
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib

import pytest
from rank_pool import free_port

import partita.planner as planner
from partita.costmodel.errors import PartitaError
from partita.cli import main
from partita.export import ExportError, SlurmOptions, export, layers_per_stage, to_megatron, to_slurm, to_torchtitan
from partita.planner.plan import Plan

SMALL = "gpt:layers=4,hidden=128,heads=4,seq=64,vocab=512"


@pytest.fixture(scope="module")
def interleaved():
    """megatron-1.7b on 2 nodes x 8: tp=2, pp=2 with 2 virtual stages each, full recompute, no ZeRO."""
    return planner.plan("megatron-1.7b", cluster="2x8xA100-80GB", train=planner.TrainConfig(global_batch=32),
                        tp=2, pp=2, virtual_stages=2, recompute="full", zero=0, sequence_parallel=True)


@pytest.fixture(scope="module")
def sharded():
    """A small model with ZeRO-3 data parallelism over 8 devices, selective recompute, no pipeline."""
    return planner.plan(SMALL, cluster="2x4xA100-80GB", train=planner.TrainConfig(global_batch=32),
                        tp=1, pp=1, zero=3, recompute="selective", micro_batch=2)


@pytest.fixture(scope="module")
def piped():
    """A small model on 2 stages (1F1B, fixed: left to the search, this overhead-bound model runs faster as one
    micro-batch of 8, GPipe, than as 1F1B's 2 of 4), tp=2, no recompute."""
    return planner.plan(SMALL, cluster="2x4xA100-80GB", train=planner.TrainConfig(global_batch=16, schedule="1F1B"),
                        tp=2, pp=2, virtual_stages=1, zero=0, recompute="none", offload=False)


def edited(plan: Plan, edit) -> Plan:
    """A copy of the plan changed by `edit(dict)`, validated like any hand-written plan."""
    d = json.loads(plan.to_json())
    edit(d)
    return Plan.from_dict(d)


# ---- Megatron-LM --------------------------------------------------------------------------------------

def megatron_parser() -> argparse.ArgumentParser:
    """The Megatron-LM flags the export may write (names as in megatron/training/arguments.py); an unknown
    or misspelled flag makes parse_args fail."""
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for flag in ("--num-layers", "--hidden-size", "--num-attention-heads", "--ffn-hidden-size", "--num-query-groups",
                 "--seq-length", "--max-position-embeddings", "--tensor-model-parallel-size",
                 "--pipeline-model-parallel-size", "--num-layers-per-virtual-pipeline-stage", "--micro-batch-size",
                 "--global-batch-size", "--recompute-num-layers", "--context-parallel-size",
                 "--expert-model-parallel-size", "--num-experts", "--moe-router-topk"):
        p.add_argument(flag, type=int)
    for flag in ("--sequence-parallel", "--use-distributed-optimizer", "--bf16", "--fp16", "--group-query-attention",
                 "--swiglu", "--disable-bias-linear", "--add-qkv-bias", "--untie-embeddings-and-output-weights"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--normalization", choices=["LayerNorm", "RMSNorm"], default="LayerNorm")
    p.add_argument("--position-embedding-type", choices=["learned_absolute", "rope", "none"], default="learned_absolute")
    p.add_argument("--rotary-base", type=float, default=10000.0)
    p.add_argument("--recompute-granularity", choices=["full", "selective"])
    p.add_argument("--recompute-method", choices=["uniform", "block"])
    p.add_argument("--pipeline-model-parallel-layout")
    p.add_argument("--optimizer", choices=["adam", "sgd"])
    return p


def megatron_args(text: str) -> tuple[argparse.Namespace, list[str]]:
    """Parsed arguments and the comment lines."""
    lines = text.splitlines()
    args = [tok for line in lines if not line.startswith("#") for tok in shlex.split(line)]
    return megatron_parser().parse_args(args), [line for line in lines if line.startswith("#")]


def test_megatron_args_carry_the_plans_degrees_batch_and_recompute(interleaved):
    p = interleaved
    a, comments = megatron_args(to_megatron(p))
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size) == (2, 2)
    assert p.mesh.world_size // (a.tensor_model_parallel_size * a.pipeline_model_parallel_size) == p.mesh.dp == 4
    assert a.num_layers == 24 and a.hidden_size == 2304 and a.num_attention_heads == 24 and a.seq_length == 2048
    assert a.num_layers_per_virtual_pipeline_stage == 24 // (2 * 2) == layers_per_stage(p)[0]
    assert a.micro_batch_size == p.schedule.micro_batch_size and a.global_batch_size == 32
    assert a.global_batch_size == a.micro_batch_size * p.schedule.num_microbatches * p.mesh.dp
    assert a.sequence_parallel and a.bf16 and not a.use_distributed_optimizer
    assert (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == ("full", "uniform", 1)
    assert a.pipeline_model_parallel_layout is None
    assert not [c for c in comments if c.startswith("# partita:")]  # everything in this plan maps


def megatron_architecture(a: argparse.Namespace) -> dict:
    """What Megatron-LM would build from the parsed flags (its defaults where a flag is absent)."""
    return {"mlp": "swiglu" if a.swiglu else "gelu", "norm": a.normalization, "positions": a.position_embedding_type,
            "rotary_base": a.rotary_base if a.position_embedding_type == "rope" else None,
            "linear_bias": not a.disable_bias_linear, "qkv_bias": a.add_qkv_bias or not a.disable_bias_linear,
            "tied": not a.untie_embeddings_and_output_weights, "experts": a.num_experts, "top_k": a.moe_router_topk}


LLAMA = {"mlp": "swiglu", "norm": "RMSNorm", "positions": "rope", "rotary_base": 10000.0, "linear_bias": False,
         "qkv_bias": False, "tied": False, "experts": None, "top_k": None}
GPT = {"mlp": "gelu", "norm": "LayerNorm", "positions": "learned_absolute", "rotary_base": None, "linear_bias": True,
       "qkv_bias": True, "tied": False, "experts": None, "top_k": None}


@pytest.mark.parametrize("model, want", [
    ("llama:layers=4,hidden=128,heads=4,kv_heads=2,ffn=344,seq=64,vocab=512", LLAMA),  # partita's llama family
    ("hf:llama", LLAMA),                                                                # transformers' Llama
    ("hf:qwen2:num_hidden_layers=2,hidden_size=128,intermediate_size=256,num_attention_heads=4,num_key_value_heads=2,"
     "vocab_size=512", {**LLAMA, "qkv_bias": True}),                                   # Llama with q/k/v biases
    ("gpt:layers=4,hidden=128,heads=4,seq=64,vocab=512", GPT),                          # untied, unlike Megatron's GPT
    ("llama:layers=4,hidden=128,heads=4,kv_heads=2,ffn=96,seq=64,vocab=512,experts=4,top_k=2",
     {**LLAMA, "experts": 4, "top_k": 2}),
])
def test_megatron_args_build_the_plans_architecture(model, want):
    """Issue 30 item 8: without --swiglu, RMSNorm, rope, --disable-bias-linear and the untied head, Megatron-LM
    would build its default GPT. The arguments parsed back build the plan's model."""
    p = planner.plan(model, cluster="2x4xA100-80GB", train=planner.TrainConfig(global_batch=16), tp=1, pp=1)
    a, comments = megatron_args(to_megatron(p))
    assert megatron_architecture(a) == want
    assert not [c for c in comments if "not translated" in c]
    assert a.ffn_hidden_size == (p.model["config"].get("ffn") or p.model["config"].get("intermediate_size"))


def test_an_architecture_megatron_cannot_be_told_is_said():
    p = planner.plan("hf:bert", cluster="2x4xA100-80GB", train=planner.TrainConfig(global_batch=16), tp=1, pp=1)
    a, comments = megatron_args(to_megatron(p))
    assert not a.swiglu and a.hidden_size == 128
    assert any(c.startswith("# partita: the architecture of hf:bert is not translated, only its sizes") for c in comments)


def test_torchtitan_names_the_llama3_flavour_with_the_plans_shape():
    """llama3-8b is torchtitan's llama3 "8B" (its rotary base differs, said in a comment); a GPT is no torchtitan
    model, and a llama of other sizes no flavour: both said."""
    p = planner.plan("llama3-8b", cluster="8xH100-80GB", train=planner.TrainConfig(global_batch=64, seq_len=2048))
    text = to_torchtitan(p)
    assert tomllib.loads(text)["model"] == {"name": "llama3", "flavor": "8B"}
    assert "rotary base 10000 (torchtitan's: 500000)" in text
    gpt = to_torchtitan(planner.plan(SMALL, cluster="2x4xA100-80GB", train=planner.TrainConfig(global_batch=16)))
    assert "model" not in tomllib.loads(gpt) or not tomllib.loads(gpt)["model"]
    assert f"# partita: the model {SMALL} has no torchtitan equivalent" in gpt
    odd = to_torchtitan(planner.plan("llama:layers=4,hidden=128,heads=4,kv_heads=2,ffn=344,seq=64,vocab=512",
                                     cluster="2x4xA100-80GB", train=planner.TrainConfig(global_batch=16)))
    assert tomllib.loads(odd)["model"] == {"name": "llama3"} and "a llama3 flavour with dim=128, n_layers=4" in odd


def test_megatron_sharding_and_selective_recompute(sharded):
    a, comments = megatron_args(to_megatron(sharded))
    assert (a.tensor_model_parallel_size, a.pipeline_model_parallel_size) == (1, 1)
    assert a.micro_batch_size == 2 and a.global_batch_size == 32
    assert a.recompute_granularity == "selective" and a.recompute_method is None and a.recompute_num_layers is None
    assert a.use_distributed_optimizer and not a.sequence_parallel
    assert any(c.startswith("# partita: ZeRO-") and "has no Megatron-LM equivalent" in c for c in comments), comments


def move_first_layer_back(d: dict) -> None:
    """Stage 1's first layer moves to stage 0 (an uneven split)."""
    first = d["stages"][1]["modules"].pop(0)
    d["stages"][0]["modules"].append(first)
    d["stages"][1]["split_at"] = d["stages"][1]["modules"][0]
    next(b for b in d["blocks"] if b["fqn"] == first)["stage"] = 0


def expand_layout(layout: str) -> list[str]:
    return [re.sub(r"(.)\*(\d+)", lambda m: m.group(1) * int(m.group(2)), stage) for stage in layout.split("|")]


def test_uneven_stages_become_a_pipeline_layout(interleaved):
    p = edited(interleaved, move_first_layer_back)
    counts = layers_per_stage(p)
    assert counts == [7, 5, 6, 6]
    a, comments = megatron_args(to_megatron(p))
    stages = expand_layout(a.pipeline_model_parallel_layout)
    assert [s.count("t") for s in stages] == counts
    assert stages[0].startswith("E") and stages[-1].endswith("L") and "".join(stages).count("E") == 1
    assert a.num_layers_per_virtual_pipeline_stage is None  # the layout already says it
    assert any("uneven stages" in c for c in comments)


def test_what_megatron_cannot_express_is_a_comment_not_dropped(piped):
    def edit(d):
        d["schedule"]["name"] = "GPipe"
        layers = [b for b in d["blocks"] if b["fqn"].startswith("blocks.")]
        layers[0]["recompute"] = "full"  # one full layer in stage 0, none in stage 1
        layers[-1]["offload_activations"] = True
    a, comments = megatron_args(to_megatron(edited(piped, edit)))
    notes = [c for c in comments if c.startswith("# partita:")]
    assert any("GPipe" in c for c in notes) and any("activation offload" in c for c in notes)
    assert any("mixed recompute" in c for c in notes), notes
    assert all("has no Megatron-LM equivalent:" in c for c in notes)
    # the stages with the most full layers still get them: block recompute of that many layers per stage
    assert (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == ("full", "block", 1)


def test_per_op_recompute_becomes_full_in_megatron_with_a_note(sharded):
    """Megatron-LM's selective keeps more than "op" does, so the layers that fit under "op" recompute in full."""
    def edit(d):
        for b in d["blocks"]:
            if b["fqn"].startswith("blocks."):
                b["recompute"] = "op"
    text = to_megatron(edited(sharded, edit))
    a, comments = megatron_args(text)
    assert (a.recompute_granularity, a.recompute_method, a.recompute_num_layers) == ("full", "uniform", 1)
    assert any("per-op selective recompute (4 layers)" in c for c in comments), comments


# ---- torchtitan ---------------------------------------------------------------------------------------

def test_torchtitan_toml_carries_the_plans_degrees(interleaved):
    p = interleaved
    t = tomllib.loads(to_torchtitan(p))
    par, tr = t["parallelism"], t["training"]
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] * par["tensor_parallel_degree"] \
        * par["pipeline_parallel_degree"] == p.mesh.world_size == 16
    assert (par["data_parallel_replicate_degree"], par["data_parallel_shard_degree"]) == (4, 1)  # no ZeRO: DDP
    assert (par["tensor_parallel_degree"], par["pipeline_parallel_degree"]) == (2, 2)
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert par["pipeline_parallel_microbatch_size"] == p.schedule.micro_batch_size
    assert par["enable_async_tensor_parallel"] is False and par["context_parallel_degree"] == 1
    assert par["module_fqns_per_model_part"] == [s.modules for s in p.stages]
    assert len(par["module_fqns_per_model_part"]) == 2 * 2  # pp x virtual stages
    assert t["activation_checkpoint"] == {"mode": "full"}
    # a pipeline splits each data-parallel rank's batch into micro-batches
    assert tr["global_batch_size"] == 32 and tr["local_batch_size"] * p.mesh.dp == 32
    assert tr["local_batch_size"] // par["pipeline_parallel_microbatch_size"] == p.schedule.num_microbatches
    assert tr["seq_len"] == 2048 and tr["mixed_precision_param"] == "bfloat16"


def test_torchtitan_fsdp_and_gradient_accumulation(sharded):
    p = sharded
    t = tomllib.loads(to_torchtitan(p))
    par, tr = t["parallelism"], t["training"]
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (8, 1)
    assert par["fsdp_reshard_after_forward"] in ("always", "never")
    assert par["pipeline_parallel_degree"] == 1 and "pipeline_parallel_schedule" not in par
    # without a pipeline partita accumulates gradients over micro-batches: torchtitan does when global > local x dp
    assert tr["local_batch_size"] == 2 and tr["global_batch_size"] // (tr["local_batch_size"] * 8) == \
        p.schedule.num_microbatches
    assert t["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}


def test_torchtitan_per_op_recompute_is_exact_and_a_mix_takes_the_strongest(sharded):
    def every(policy):
        def edit(d):
            layers = [b for b in d["blocks"] if b["fqn"].startswith("blocks.")]
            for i, b in enumerate(layers):
                b["recompute"] = policy(i)
        return edit
    text = to_torchtitan(edited(sharded, every(lambda i: "op")))
    assert tomllib.loads(text)["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert "recompute" not in "".join(line for line in text.splitlines() if line.startswith("# partita:"))
    text = to_torchtitan(edited(sharded, every(lambda i: ("op", "selective")[i % 2])))
    assert tomllib.loads(text)["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert "mixed recompute (2 selective, 2 op)" in text and "every layer takes op" in text


@pytest.mark.parametrize("zero,shard,replicate,reshard", [(2, 2, 1, "never"), (3, 2, 1, "always"), (0, 1, 2, None)])
def test_torchtitan_zero_stages(piped, zero, shard, replicate, reshard):
    p = edited(piped, lambda d: d.update(zero_stage=zero))
    par = tomllib.loads(to_torchtitan(p))["parallelism"]
    assert (par["data_parallel_shard_degree"], par["data_parallel_replicate_degree"]) == (shard, replicate)
    assert par.get("fsdp_reshard_after_forward") == reshard


@pytest.mark.parametrize("name", ["1F1B", "GPipe"])
def test_torchtitan_schedule_names(piped, name):
    p = edited(piped, lambda d: d["schedule"].update(name=name))
    assert tomllib.loads(to_torchtitan(p))["parallelism"]["pipeline_parallel_schedule"] == name


def test_torchtitan_every_nth_layer_and_offload(sharded):
    def edit(d):
        layers = [b for b in d["blocks"] if b["fqn"].startswith("blocks.")]
        for i, b in enumerate(layers):
            b["recompute"] = "full" if i % 2 == 0 else "none"
            b["offload_activations"] = i == 0
    text = to_torchtitan(edited(sharded, edit))
    t = tomllib.loads(text)
    assert t["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "2"}  # 2 of 4 layers
    assert "# partita: activation offload to host memory (blocks.0) has no torchtitan equivalent" in text


# ---- SLURM --------------------------------------------------------------------------------------------

def sbatch(text: str) -> dict[str, str]:
    return dict(line[len("#SBATCH --"):].split("=", 1) for line in text.splitlines() if line.startswith("#SBATCH"))


def test_slurm_script_has_the_plans_nodes_and_runs_the_launcher_per_node(interleaved, tmp_path):
    text = to_slurm(interleaved, "/shared/plans/plan.json",
                    SlurmOptions(model="megatron-1.7b", steps=50, partition="gpu", time="02:00:00", account="proj",
                                 max_restarts=2))
    s = sbatch(text)
    nodes = interleaved.mesh.world_size // interleaved.cluster["devices_per_node"]
    assert int(s["nodes"]) == nodes == 2 and s["gpus-per-node"] == "8" and s["ntasks-per-node"] == "1"
    assert (s["partition"], s["time"], s["account"]) == ("gpu", "02:00:00", "proj")
    run = text[text.index("srun "):].replace("\\\n", " ")
    launcher = shlex.split(run.splitlines()[0])
    # runtime.train itself is torchrun's agent on each node (its launcher mode), not torch.distributed.run
    assert launcher[launcher.index("-m") + 1] == "partita.runtime.train" and "torch.distributed.run" not in text
    assert launcher[launcher.index("--nproc-per-node") + 1] == "8"
    assert launcher[launcher.index("--max-restarts") + 1] == "2"
    assert "--model" in launcher and "--steps" in launcher
    assert "PLAN=/shared/plans/plan.json" in text.splitlines()
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0


def test_slurm_script_runs_under_fake_slurm(interleaved, tmp_path):
    """The script with stand-ins for scontrol, srun and python: what the pre-flight check and srun are asked to
    start on each node."""
    plan = tmp_path / "plan.json"
    interleaved.save(plan)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    log, checks = tmp_path / "calls", tmp_path / "checks"
    # a long node list (more than a pipe holds): the script must read it all, or scontrol dies of SIGPIPE
    (bin_ / "scontrol").write_text("#!/bin/sh\necho gpu-a17; echo gpu-a18; seq -f gpu-b%g 20000\n")
    (bin_ / "srun").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {log}\n')
    # the stand-in python records the pre-flight call and fails it when FAIL_CHECK is set, as runtime.train would
    (bin_ / "fakepython").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {checks}\n'
                                     'if [ -n "$FAIL_CHECK" ]; then\n'
                                     '    echo "partita: error: $FAIL_CHECK" >&2; exit 2\nfi\n')
    for f in bin_.iterdir():
        f.chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(to_slurm(interleaved, str(plan), SlurmOptions(model="megatron-1.7b", steps=3, port=29555)))
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "PYTHON": str(bin_ / "fakepython"),
           "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "gpu-a[17-18]", "SLURM_JOB_ID": "4242"}
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    argv = log.read_text().splitlines()
    assert argv[:2] == ["--ntasks-per-node=1", str(bin_ / "fakepython")]  # one launcher per node
    assert argv[argv.index("-m") + 1] == "partita.runtime.train" and argv[argv.index("partita.runtime.train") + 1] == str(plan)
    assert argv[argv.index("--rdzv-endpoint") + 1] == "gpu-a17:29555"
    assert argv[argv.index("--rdzv-id") + 1] == "4242" and argv[argv.index("--nnodes") + 1] == "2"
    assert argv[argv.index("--nproc-per-node") + 1] == "8" and argv[argv.index("--model") + 1] == "megatron-1.7b"
    # the pre-flight check ran first, in one process, for the job's world size (2 nodes x 8)
    check = checks.read_text().splitlines()
    assert check[-1] == "--check" and check[check.index("partita.runtime.train") + 1] == str(plan)
    assert (check[check.index("--nnodes") + 1], check[check.index("--nproc-per-node") + 1]) == ("2", "8")
    assert "--rdzv-endpoint" not in check
    # a failing pre-flight stops the job with its one line, before srun starts anything
    log.unlink()
    r = subprocess.run(["bash", str(script)], env={**env, "FAIL_CHECK": "plan is for 16 ranks"}, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == ["partita: error: plan is for 16 ranks"]
    assert not log.exists()
    # a job with the wrong number of nodes stops before starting anything
    r = subprocess.run(["bash", str(script)], env={**env, "SLURM_NNODES": "3"}, capture_output=True, text=True)
    assert r.returncode == 2 and "needs 2 node(s), this job has 3" in r.stderr
    assert not log.exists()


@pytest.fixture
def cpu_job(tmp_path_factory):
    """A 2-process CPU plan of tiny-gpt as a SLURM script on one node, with stand-ins for scontrol and srun that
    run the node's command here (the real python, the real launcher, gloo). One a test, each on a port of its own:
    shared by the module, the second test's launcher found the first one's port still held (a fresh-clone CI in
    session 70: "the port is held by another program, not a rendezvous store")."""
    tmp = tmp_path_factory.mktemp("slurm")
    plan = tmp / "plan.json"
    planner.plan("tiny-gpt", cluster="2xcpu", train=planner.TrainConfig(global_batch=4)).save(plan)
    bin_ = tmp / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text("#!/bin/sh\necho 127.0.0.1\n")
    (bin_ / "srun").write_text('#!/bin/sh\nshift\nexec "$@"\n')  # drops --ntasks-per-node=1; this is the node
    for f in bin_.iterdir():
        f.chmod(0o755)
    script = tmp / "job.sbatch"
    script.write_text(to_slurm(Plan.load(plan), str(plan), SlurmOptions(model="tiny-gpt", steps=1,
                                                                       python=sys.executable, port=free_port())))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "PYTHONPATH": root, "OMP_NUM_THREADS": "1",
           "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "localhost", "SLURM_JOB_ID": "77"}
    env.pop("PYTHON", None)
    return script, env


def test_slurm_script_trains_through_the_launcher_on_a_cpu_node(cpu_job):
    script, env = cpu_job
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=300, cwd=script.parent)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "partita run: tiny-gpt on 2 rank(s)" in r.stdout and "step time" in r.stdout, r.stdout


def test_a_failing_rank_under_the_slurm_script_is_one_line(cpu_job):
    """Every rank's loss turns NaN at step 1: the launcher prints the first failing rank once and exits 3."""
    script, env = cpu_job
    r = subprocess.run(["bash", str(script)], env={**env, "PARTITA_FAULT": "nan,step=1"}, capture_output=True,
                       text=True, timeout=300, cwd=script.parent)
    assert r.returncode == 3, r.stdout[-2000:] + r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("partita: error: rank "), r.stderr
    assert "loss is nan at step 1" in lines[0], lines


def test_slurm_nodes_follow_gpus_per_node_and_cpu_plans_ask_no_gpus(piped):
    text = to_slurm(piped, "p.json", SlurmOptions(model=SMALL, gpus_per_node=2))
    assert sbatch(text)["nodes"] == "4" and "priced for 4 devices per node" in text
    cpu = edited(piped, lambda d: d["cluster"].update(spec="2x4xcpu", device="cpu"))
    s = sbatch(to_slurm(cpu, "p.json", SlurmOptions(model=SMALL)))
    assert s["nodes"] == "2" and "gpus-per-node" not in s


@pytest.mark.parametrize("edit,opts,needle", [
    (lambda d: d["cluster"].update(groups=[{"name": "1x8xA100-80GB"}, {"name": "1x8xV100-32GB"}]), {},
     "heterogeneous (1x8xA100-80GB, 1x8xV100-32GB), not nodes x devices"),
    (lambda d: None, {"gpus_per_node": 3}, "the plan's 8 ranks are not whole nodes of 3 devices"),
    (lambda d: d["cluster"].update(num_devices=16), {}, "mesh uses 8 ranks but its cluster"),
    (lambda d: d["cluster"].pop("devices_per_node"), {}, "give --gpus-per-node G"),
])
def test_slurm_refuses_plans_that_are_not_whole_nodes(piped, edit, opts, needle):
    with pytest.raises(ExportError, match=re.escape(needle)):
        to_slurm(edited(piped, edit), "p.json", SlurmOptions(model=SMALL, **opts))


# ---- the command line ---------------------------------------------------------------------------------

def test_export_through_the_cli(piped, tmp_path):
    plan = tmp_path / "plan.json"
    piped.save(plan)
    r = subprocess.run([sys.executable, "-m", "partita.cli", "export", str(plan), "--to", "torchtitan"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert tomllib.loads(r.stdout)["parallelism"]["tensor_parallel_degree"] == 2
    assert r.stdout == export(piped, "torchtitan")


def test_export_cli_writes_files_and_refuses_bad_input(piped, tmp_path, capsys):
    plan = tmp_path / "plan.json"
    piped.save(plan)
    out = tmp_path / "train.sbatch"
    assert main(["export", str(plan), "--to", "slurm", "--model", SMALL, "--out", str(out)]) == 0
    assert f"PLAN={plan}" in out.read_text() and os.access(out, os.X_OK)
    capsys.readouterr()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for argv, needle in ((["export", str(bad), "--to", "megatron"], "is not valid JSON"),
                         (["export", str(plan), "--to", "slurm"], "--to slurm needs --model"),
                         (["export", str(plan), "--to", "megatron", "--model", SMALL], "--model apply to --to slurm")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("partita: error:") and needle in err[0], err
    with pytest.raises(SystemExit) as e:
        main(["export", str(plan), "--to", "deepspeed"])
    assert e.value.code == 2 and "invalid choice: 'deepspeed'" in capsys.readouterr().err


def test_export_names_an_unknown_format():
    with pytest.raises(PartitaError, match="unknown export format 'deepspeed'"):
        export(None, "deepspeed")


def test_context_and_expert_parallel_degrees_are_exported():
    cp = planner.plan("llama3-8b", cluster="8x8xH100-80GB",
                      train=planner.TrainConfig(global_batch=64, seq_len=131072), cp=4)
    par = tomllib.loads(to_torchtitan(cp))["parallelism"]
    assert par["context_parallel_degree"] == 4
    assert par["data_parallel_shard_degree"] * par["data_parallel_replicate_degree"] * par["tensor_parallel_degree"] \
        * par["pipeline_parallel_degree"] * par["context_parallel_degree"] == cp.mesh.world_size
    args, _ = megatron_args(to_megatron(cp))
    assert args.context_parallel_size == 4
    ep = edited(cp, lambda d: d["mesh"].update(ep=2))
    assert tomllib.loads(to_torchtitan(ep))["parallelism"]["expert_parallel_degree"] == 2
    assert megatron_args(to_megatron(ep))[0].expert_model_parallel_size == 2


def test_the_slurm_script_does_not_name_the_exporting_machines_interpreter(piped, tmp_path, capsys):
    """Issue 30 item 14: the script ran $PYTHON defaulting to the venv `partita export` ran in, a path the
    compute nodes need not have; now python from the job's PATH, or --python, or $PYTHON at submission."""
    plan = tmp_path / "p.json"
    piped.save(plan)
    assert main(["export", str(plan), "--to", "slurm", "--model", SMALL]) == 0
    text = capsys.readouterr().out
    assert sys.executable not in text and "DEFAULT_PYTHON=python\n" in text and 'PYTHON="${PYTHON:-$DEFAULT_PYTHON}"' in text
    assert main(["export", str(plan), "--to", "slurm", "--model", SMALL, "--python", "/opt/env/bin/python"]) == 0
    assert "DEFAULT_PYTHON=/opt/env/bin/python\n" in capsys.readouterr().out


# ---- hostile text (issue 47, item 1) -------------------------------------------------------------------

HOSTILE = "x\ntouch INJECTED\n# \x1b[31mred\x1b[0m \u202e\r\u2028touch INJECTED2 $(touch INJECTED3)`touch INJECTED4`"


def hostile(plan: Plan) -> Plan:
    """The plan with every free-text field a command in disguise: built in memory (Plan.load refuses such a
    file, test_a_plan_file_with_control_characters_is_refused), so the exporters' own quoting is what is tested."""
    return dataclasses.replace(plan, model={**plan.model, "name": HOSTILE},
                               cluster={**plan.cluster, "device": HOSTILE, "spec": HOSTILE})


def test_a_hostile_plan_runs_no_command_through_the_slurm_script(piped, tmp_path):
    """The script, run by bash with stand-ins for scontrol, srun and python, and a hostile plan path, model
    string and interpreter: nothing but the stand-ins runs, and the words they get are the options verbatim."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text("#!/bin/sh\necho node-a; echo node-b\n")
    (bin_ / "srun").write_text(f'#!/bin/bash\nprintf "%s\\0" "$@" > {tmp_path / "srun.args"}\n')
    python = tmp_path / "py $(touch INJECTED5)"
    python.write_text("#!/bin/sh\nexit 0\n")
    for f in (*bin_.iterdir(), python):
        f.chmod(0o755)
    model = "m'; touch INJECTED6; '"
    opts = SlurmOptions(model=model, python=str(python), data=f"d\n{HOSTILE}")
    text = to_slurm(hostile(piped), f"plan\n{HOSTILE}.json", opts)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "n",
           "SLURM_JOB_ID": "7"}
    env.pop("PYTHON", None)
    plan_file = tmp_path / f"plan\n{HOSTILE}.json"
    plan_file.write_text("{}")  # readable at the hostile path, so the script goes on to srun
    r = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert not list(tmp_path.glob("INJECTED*")), r.stderr
    argv = (tmp_path / "srun.args").read_bytes().decode().split("\0")  # (read_text would turn \r into \n)
    assert argv[1] == str(python) and argv[argv.index("--model") + 1] == model
    assert argv[argv.index("partita.runtime.train") + 1] == plan_file.name
    assert argv[argv.index("--data") + 1] == f"d\n{HOSTILE}"


@pytest.mark.parametrize("field, value", [("job_name", "p\n#SBATCH --x"), ("partition", "gpu;touch X"),
                                          ("time", "1:00 $(id)"), ("account", "a b")])
def test_slurm_options_that_would_escape_their_line_are_refused(piped, field, value):
    with pytest.raises(ExportError, match=f"--{field.replace('_', '-')} .* holds characters a SLURM option cannot"):
        to_slurm(piped, "p.json", SlurmOptions(model=SMALL, **{field: value}))


def test_a_hostile_plan_adds_no_megatron_argument(piped):
    """`ARGS=$(grep -v '^#' megatron.args)`: the hostile text stays on comment lines, and the arguments are the
    benign plan's."""
    text = to_megatron(hostile(piped))
    assert text.count("\n") == to_megatron(piped).count("\n")
    assert all(line.startswith("#") or line.startswith("--") for line in text.splitlines())
    assert "\x1b" not in text and "\u202e" not in text and "\r" not in text
    assert megatron_args(text)[0] == megatron_args(to_megatron(piped))[0]


def test_a_hostile_plan_adds_no_torchtitan_key(piped):
    text = to_torchtitan(hostile(piped))
    assert tomllib.loads(text) == tomllib.loads(to_torchtitan(piped))
    assert "\x1b" not in text and "\u202e" not in text


def test_a_plan_file_with_control_characters_is_refused(piped, tmp_path, capsys):
    """Every command loads a plan through Plan.load: a name holding a newline, an escape or a bidirectional
    override is refused in one line that names the field, before anything is exported, explained or run."""
    for field, value in (("device", "cpu\ntouch INJECTED\n#"), ("spec", "\x1b]0;title\x07"),
                         ("devices_per_node", "8\ntouch INJECTED")):
        d = json.loads(piped.to_json())
        d["cluster"][field] = value
        path = tmp_path / "p.json"
        path.write_text(json.dumps(d))
        for argv in (["export", str(path), "--to", "slurm", "--model", SMALL], ["explain", str(path)]):
            assert main(argv) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and f"cluster.{field}" in err[0] and "\x1b" not in err[0], err
    d = json.loads(piped.to_json())
    d["model"]["name"] = "gpt\u202eevil"
    with pytest.raises(PartitaError, match=r"plan.model.name holds a control character \(gpt\\u202eevil\)"):
        Plan.from_dict(d)
