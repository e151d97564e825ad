"""Plans with embedding tables run through TorchRec's DistributedModelParallel on gloo ranks and train like
one process (issue 28, item 5): `partita run --verify` compares the losses and every rank's table pieces with
single-process training, for table-, row-, column-wise, data-parallel (2 ranks) and table-row-wise (2 nodes of
2 ranks) tables. The export and the pre-flight refusals run in this process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import rank_pool
import torch

from partita.costmodel.models import resolve_model
from partita.planner.api import plan
from partita.cli import main
from partita.planner.sparse.rec_plan import SparseInputs
from partita.planner.search import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
SMALL = "dlrm:tables=4,rows=64-80-96-50,dim=8,bottom=16-8,top=16-1,dense=4,pooling=2"
WIDE = "dlrm:tables=3,rows=64-80-96,dim=16,bottom=16,top=16-1,dense=4,pooling=2"


def _plan_file(tmp_path, model, cluster, fixed, optimizer, **dense) -> str:
    p = plan(model, cluster=cluster, train=TrainConfig(global_batch=16),
             sparse=SparseInputs(fixed=fixed, optimizer=optimizer), **dense)
    path = tmp_path / "plan.json"
    p.save(path)
    return str(path)


def _run(plan_path: str, model: str, verify: bool = True, *flags: str):
    """The plan's ranks on the test session's long-lived gloo workers (tests/rank_pool.py), as `partita run`'s
    workers: the same entry point, one node."""
    return rank_pool.run_plan(plan_path, model, "--steps", "3", "--lr", "0.05", *(["--verify"] if verify else []),
                              *flags, cwd=ROOT)


def _launch(plan_path: str, model: str) -> subprocess.CompletedProcess:
    """`partita run --verify` through the launcher: several nodes' groups (TorchRec's intra- and cross-node process
    groups, which it keeps for the process's life) need fresh processes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "partita.cli", "run", plan_path, "--model", model, "--steps", "3",
                           "--lr", "0.05", "--verify"], env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_every_sharding_type_trains_like_one_process(tmp_path):
    fixed = ("embeddings.cat_0=table_wise,embeddings.cat_1=row_wise,embeddings.cat_2=column_wise:2,"
             "embeddings.cat_3=data_parallel")
    losses = tmp_path / "losses.json"
    out = _run(_plan_file(tmp_path, SMALL, "2xcpu", fixed, "rowwise_adagrad"), SMALL, True,
               "--log-every", "2", "--losses-out", str(losses))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DistributedModelParallel (column_wise, data_parallel, row_wise, table_wise" in out.stdout
    assert "max |loss - reference|" in out.stdout and "tables after step 3" in out.stdout
    assert out.stdout.count(": OK") == 2
    # #46: the header, then a progress line after the first step, every 2nd and the last, then the report
    lines = out.stdout.splitlines()
    progress = [i for i, ln in enumerate(lines) if ln.startswith("step ") and "/3  loss " in ln]
    assert lines[0].startswith("partita run: ") and [lines[i][:8] for i in progress] == ["step 1/3", "step 2/3",
                                                                                         "step 3/3"]
    assert progress[-1] < lines.index("step  loss          reference     |diff|")
    written = json.loads(losses.read_text())
    table = [float(ln.split()[1]) for ln in lines if ln[:4].strip().isdigit()]
    assert written["losses"] == pytest.approx(table, abs=1e-8) and len(written["reference_losses"]) == 3


@pytest.mark.slow
def test_table_row_wise_over_two_nodes_trains_like_one_process(tmp_path):
    # and the dense part sharded by FSDP2 over the 4 ranks (--zero 3)
    fixed = "embeddings.cat_0=table_row_wise,embeddings.cat_1=table_wise,embeddings.cat_2=column_wise:4"
    out = _launch(_plan_file(tmp_path, WIDE, "2x2xcpu", fixed, "sgd", zero=3), WIDE)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "table_row_wise" in out.stdout and out.stdout.count(": OK") == 2
    assert "dense part sharded (FSDP2)" in out.stdout


@pytest.mark.slow
def test_without_verify_no_rank_builds_the_whole_tables(tmp_path):
    # the tables stay on the meta device (runtime.rec.run.build) and each rank holds its TorchRec pieces only
    out = _run(_plan_file(tmp_path, SMALL, "2xcpu", "*=row_wise", "sgd"), SMALL, verify=False)
    assert out.returncode == 0, out.stdout + out.stderr
    losses = [float(line.split()[1]) for line in out.stdout.splitlines() if line[:4].strip().isdigit()]
    assert len(losses) == 3 and all(0 < x < 10 for x in losses)


@pytest.mark.slow
def test_a_torchrec_model_trains_like_one_process_with_every_sharding_type(tmp_path):
    # TorchRec's own DLRM over an EmbeddingBagCollection, with a KeyedJaggedTensor input (tests/torchrec_factories)
    model = "torchrec_factories:dlrm"
    fixed = "t_users=row_wise,t_items=column_wise:2,t_ads=table_wise,t_tags=data_parallel"
    path = _plan_file(tmp_path, model, "2xcpu", fixed, "rowwise_adagrad")
    out = _run(path, model)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "4 embedding tables through TorchRec DistributedModelParallel (column_wise, data_parallel, row_wise, " \
           "table_wise" in out.stdout
    assert out.stdout.count(": OK") == 2 and "pieces checked hold" not in out.stdout


@pytest.mark.slow
def test_a_torchrec_model_with_a_sharded_dense_part_trains_like_one_process(tmp_path):
    # FSDP2 units on every Linear, the tower's projection too; the tower's own gain, beside the collection, is
    # averaged by hand (without that its gradients stay each rank's own and both checks fail)
    model = "torchrec_factories:tower"
    fixed = "t_users=row_wise,t_items=column_wise:2,t_ads=table_wise,t_tags=data_parallel"
    out = _run(_plan_file(tmp_path, model, "2xcpu", fixed, "sgd", zero=3), model)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "dense part sharded (FSDP2)" in out.stdout and out.stdout.count(": OK") == 2


def test_a_torchrec_model_is_built_lean_with_its_constructors_buffers():
    # tables on the meta device, everything else as the factory builds it: TorchRec's InteractionArch computes
    # its triu_indices buffer in its constructor, which materialising a meta-built module would lose
    sys.path.insert(0, str(ROOT / "tests"))
    from partita.runtime.rec.run import build
    import torchrec_factories
    lean = build(resolve_model("torchrec_factories:dlrm"), torch.device("cpu"), tables=False)
    tables = lean.model.sparse_arch.embedding_bag_collection.embedding_bags
    assert all(t.weight.is_meta for t in tables.values())
    want = torchrec_factories.dlrm()[0].inter_arch.triu_indices
    assert torch.equal(lean.model.inter_arch.triu_indices, want)
    assert not any(p.is_meta for n, p in lean.named_parameters() if "embedding_bags" not in n)


def test_the_run_builds_tables_only_to_verify():
    from partita.runtime.rec.run import build
    spec = resolve_model(SMALL)
    lean, whole = build(spec, torch.device("cpu"), tables=False), build(spec, torch.device("cpu"), tables=True)
    assert lean.embeddings["cat_0"].weight.is_meta and not lean.bottom[0].weight.is_meta
    assert not whole.embeddings["cat_0"].weight.is_meta


def test_split_into_ids_and_dense_part_is_the_model():
    from partita.runtime.rec.run import split
    spec = resolve_model(SMALL)
    model = spec.build()
    ids, dense, names = split(model)
    inputs = (torch.randn(3, 4), torch.randint(0, 50, (3, 4, 2)))
    pooled = [model.get_submodule(n)(t) for n, t in zip(names, ids(*inputs))]
    assert names == [f"embeddings.cat_{i}" for i in range(4)]
    assert torch.equal(dense(*inputs, *pooled), model(*inputs))
    assert not any("embeddings" in n for n, _ in dense.named_parameters())


def test_export_to_torchrec_builds_the_planned_shardings(tmp_path, capsys):
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    fixed = ("embeddings.cat_0=table_wise,embeddings.cat_1=row_wise@cache,embeddings.cat_2=column_wise:2,"
             "embeddings.cat_3=data_parallel")
    path = _plan_file(tmp_path, SMALL, "2xA100-40GB", fixed, "rowwise_adagrad")
    assert main(["export", path, "--to", "torchrec"]) == 0
    code = capsys.readouterr().out
    namespace: dict = {}
    exec(compile(code, "export.py", "exec"), namespace)
    ebc = EmbeddingBagCollection(device=torch.device("meta"), tables=[
        EmbeddingBagConfig(name=f"embeddings__cat_{i}", embedding_dim=8, num_embeddings=r,
                           feature_names=[f"embeddings__cat_{i}"]) for i, r in enumerate((64, 80, 96, 50))])
    module_plan = namespace["sharding_plan"](ebc).plan["ebc"]
    kinds = {name: (ps.sharding_type, ps.compute_kernel) for name, ps in module_plan.items()}
    assert kinds == {"embeddings__cat_0": ("table_wise", "fused"), "embeddings__cat_1": ("row_wise", "fused_uvm_caching"),
                     "embeddings__cat_2": ("column_wise", "fused"), "embeddings__cat_3": ("data_parallel", "dense")}
    assert module_plan["embeddings__cat_1"].cache_params.load_factor in (0.01, 0.05, 0.2)
    assert main(["export", str(ROOT / "tests" / "e2e" / "missing.json"), "--to", "torchrec"]) == 2


def test_run_refuses_another_model_in_one_line(tmp_path, capfd):
    """The launcher process's pre-flight says it (on the file descriptor: it is a process of its own)."""
    path = _plan_file(tmp_path, SMALL, "2xcpu", None, "sgd")
    env_model = "dlrm:tables=4,rows=64-80-96-51,dim=8,bottom=16-8,top=16-1,dense=4,pooling=2"
    code = main(["run", path, "--model", env_model, "--steps", "1"])
    err = capfd.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "fingerprint" in err


def test_run_refuses_evaluation_and_the_hang_watch_in_one_line(tmp_path, capfd):
    """TorchRec's loop neither evaluates nor watches for hangs yet: said before launch, not ignored."""
    path = _plan_file(tmp_path, SMALL, "2xcpu", None, "sgd")
    code = main(["run", path, "--model", SMALL, "--steps", "1", "--eval-data", path, "--hang-timeout", "5"])
    err = capfd.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--eval-data and --hang-timeout apply to dense plans; this plan has embedding tables" in err
    # nor checkpoints, weights out or the recipe's extras: refused, not silently ignored
    code = main(["run", path, "--model", SMALL, "--steps", "1", "--checkpoint-dir", str(tmp_path / "ck"),
                 "--save-final", str(tmp_path / "w.pt"), "--clip-grad-norm", "1"])
    err = capfd.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--checkpoint-dir, --save-final and --clip-grad-norm apply to dense plans" in err


def test_without_torchrec_the_run_says_how_to_install_it(monkeypatch):
    from partita.costmodel.errors import PartitaError
    from partita.runtime.rec import run as rec
    monkeypatch.setitem(sys.modules, "torchrec", None)
    with pytest.raises(PartitaError, match=r"partita\[rec\].*--no-deps torchrec"):
        rec.require_torchrec()
