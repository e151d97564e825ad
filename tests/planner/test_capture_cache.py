"""costmodel.capture.cache (issue 44: a second plan of the same model skips capture): a warm plan equals a cold one
but for its wall times, loads its graph instead of capturing it and imports neither torch nor torch._dynamo; another
key misses; a corrupt file is a miss that the next capture replaces; a model given as code is never cached."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn

from partita.costmodel.capture import cache
from partita.costmodel.models import resolve_model
from partita.costmodel.models.configs import CNN_PRESETS, PRESETS, gpt_config_of
from partita.planner import api
from partita.planner.plan import executable
from partita.planner.search import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
TINY = TrainConfig(global_batch=4)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    """A cold capture cache of this test's own (not the session's shared one)."""
    monkeypatch.setenv(cache.ENV, str(tmp_path / "cache"))
    return tmp_path / "cache" / "capture"


@pytest.fixture
def captures(monkeypatch) -> list:
    """The models planner.api captured (each call of capture, recorded)."""
    calls = []
    real = api.capture
    monkeypatch.setattr(api, "capture", lambda spec, **kw: calls.append(spec.name) or real(spec, **kw))
    return calls


def plan(model="tiny-gpt", train=TINY, **kw):
    return api.plan(model, cluster="2xcpu", train=train, **kw)


def exactly(graph) -> str:
    """Everything of an OpGraph but its capture time, types and orders included (repr tells 1 from 1.0 and a tuple
    from a list): nodes and their attributes, edges, each node's successors and predecessors, graph attributes."""
    g = graph.g
    return repr((list(g.nodes(data=True)), list(g.edges(data=True)), g.graph,
                 [(n, list(g.successors(n)), list(g.predecessors(n))) for n in g],
                 {k: v for k, v in vars(graph).items() if k not in ("g", "_by_group", "capture_seconds")}))


# a warm plan ------------------------------------------------------------------------------------------------------
def test_a_warm_plan_is_the_cold_plan_without_capturing(cache_dir, captures, monkeypatch):
    cold = plan()
    assert captures == ["tiny-gpt"] and len(list(cache_dir.glob("*.json"))) == 1
    monkeypatch.setattr(api, "_fingerprint_and_tables", lambda spec: pytest.fail("built the model on meta"))
    warm = plan()
    assert captures == ["tiny-gpt"]  # loaded, not captured
    assert warm.canonical_json() == cold.canonical_json()  # all but the wall times (Plan.MEASURED)
    assert set(json.loads(warm.to_json())["solver"]) == set(json.loads(cold.to_json())["solver"])
    assert warm.model == cold.model and warm.model["fingerprint"].startswith("sha256:")


@pytest.mark.parametrize("model, dtype", [("tiny-gpt", "bf16"), ("tiny-moe", "bf16"), ("tiny-resnet", "fp32")])
def test_a_loaded_graph_equals_the_fresh_capture(model, dtype, cache_dir, graph_of):
    fresh = graph_of(model, dtype)
    k = cache.key(model, seq=None, dtype=dtype, autocast="cuda")
    path = cache.store(k, fresh, name=model, config={"shape": (1, 2), "names": ["a"]}, fingerprint="sha256:x")
    assert path is not None and path.parent == cache_dir and not list(cache_dir.glob(".tmp-*"))
    hit = cache.load(k)
    assert exactly(hit.graph) == exactly(fresh)
    assert (hit.name, hit.config, hit.fingerprint) == (model, {"shape": (1, 2), "names": ["a"]}, "sha256:x")
    assert hit.graph.capture_seconds < fresh.capture_seconds  # this run's cost of the graph: the load


@pytest.mark.parametrize("cluster", ["2xcpu", "2x8xA100-80GB"])
def test_a_warm_cli_plan_imports_neither_dynamo_nor_torch(cluster, cache_dir, tmp_path):
    """The regression this cache is for: torch's import ~2-3 s, where the warm plan itself takes ~0.2 s. On GPUs
    the search also weighs activation offload beside selective recompute, which asks what this torch's checkpoint
    policies see (planner.plan.executable): read from torch's source, not by importing it. The cold plan imports
    torch but not torch._dynamo, which FakeTensorMode would import (costmodel.capture.defer)."""
    argv = ["plan", "--model", "tiny-gpt", "--cluster", cluster, "--global-batch", "4",
            "--out", str(tmp_path / "p.json")]
    code = ("import sys; from partita.cli import main; code = main(sys.argv[1:]); "
            "sys.stderr.write(repr([m for m in ('torch._dynamo', 'torch') if m in sys.modules])); sys.exit(code)")
    env = {**os.environ, cache.ENV: str(cache_dir.parent), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    runs = [subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=300,
                           cwd=ROOT, env=env) for _ in range(2)]
    assert [r.returncode for r in runs] == [0, 0], runs[-1].stderr[-2000:]
    assert runs[0].stderr.strip().splitlines()[-1] == "['torch']", runs[0].stderr[-2000:]  # cold: captured
    assert runs[1].stderr.strip().splitlines()[-1] == "[]", "a warm plan imported " + runs[1].stderr[-2000:]


# keys ---------------------------------------------------------------------------------------------------------------
def test_another_seq_dtype_or_config_misses(cache_dir, captures):
    plan()
    plan(train=TrainConfig(global_batch=4, seq_len=16))
    plan(train=TrainConfig(global_batch=4, dtype="bf16"))
    plan("gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32")  # tiny-gpt's config, another MODEL string
    plan("gpt:layers=3,hidden=64,heads=4,vocab=256,seq=32")
    assert captures == ["tiny-gpt"] * 3 + ["gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32",
                                           "gpt:layers=3,hidden=64,heads=4,vocab=256,seq=32"]
    assert len(list(cache_dir.glob("*.json"))) == 5
    plan("gpt:layers=3,hidden=64,heads=4,vocab=256,seq=32")
    plan(train=TrainConfig(global_batch=4, seq_len=16))
    assert len(captures) == 5  # each hit its own


def test_the_key_holds_versions_and_the_costmodel_source(cache_dir, monkeypatch):
    k = cache.key("hf:gpt2", seq=64, dtype="bf16", autocast="cuda")
    assert k["torch"] == torch.__version__ and k["transformers"] and k["python"] == sys.version
    assert cache.key("tiny-gpt", seq=None, dtype="fp32", autocast="cpu")["transformers"] is None
    assert len(k["costmodel"]) == 64
    cache.store(k, _small_graph(), name="hf:gpt2", config={}, fingerprint="f")
    assert cache.load(k) is not None
    for field, other in (("costmodel", "0" * 64), ("torch", "0.0"), ("transformers", "0.0"), ("autocast", "cpu")):
        assert cache.load({**k, field: other}) is None, field
    monkeypatch.setattr(cache, "source_digest", lambda: "1" * 64)  # an edited capture or pricing file
    assert cache.load(cache.key("hf:gpt2", seq=64, dtype="bf16", autocast="cuda")) is None


# files that are not captures ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("text", [b"", b"{", b"\xff\xfe", b"[]", b'{"d": 5}', b'{"t": []}', b'{"x": 1, "y": 2}',
                                  b'{"d": [[{"l": []}, 1]]}', b"NaN"])
def test_a_corrupt_file_is_a_miss_and_is_rewritten(text, cache_dir, captures):
    cold = plan()
    (path,) = cache_dir.glob("*.json")
    path.write_bytes(text)
    again = plan()
    assert captures == ["tiny-gpt", "tiny-gpt"] and again.canonical_json() == cold.canonical_json()
    assert cache.decode(path.read_bytes())["key"]["model"] == "tiny-gpt"  # replaced by the new capture
    plan()
    assert len(captures) == 2


def test_a_file_of_another_key_or_with_a_bad_field_is_a_miss(cache_dir):
    k = cache.key("tiny-gpt", seq=None, dtype="fp32", autocast="cpu")
    path = cache.store(k, _small_graph(), name="tiny-gpt", config={}, fingerprint="f")
    entry = cache.decode(path.read_bytes())
    for bad in ({**entry, "key": {**k, "seq": 7}}, {**entry, "fingerprint": 3},
                {**entry, "graph": {**entry["graph"], "fields": {**entry["graph"]["fields"], "batch": "1"}}},
                {**entry, "graph": {**entry["graph"], "edges": [["a", "nowhere", {}]]}}):
        path.write_text(cache.encode(bad))
        assert cache.load(k) is None
    path.write_text(cache.encode(entry))
    assert cache.load(k) is not None


def test_values_round_trip_with_their_types_and_others_are_not_written(cache_dir):
    value = {"a": (1, 2.0, True, None, "s"), 3: [(), [], {}], (4, 5): {"inf": float("inf")}, "f": 0.1 + 0.2}
    back = cache.decode(cache.encode(value))
    assert repr(back) == repr(value)
    for odd in (torch.float32, {1, 2}, nn.Linear, b"bytes"):
        with pytest.raises(ValueError):
            cache.encode({"x": odd})
    k = cache.key("tiny-gpt", seq=None, dtype="fp32", autocast="cpu")
    graph = _small_graph()
    graph.g.nodes["a"]["dtype"] = torch.float32  # a capture holding a value the cache cannot write back exactly
    assert cache.store(k, graph, name="tiny-gpt", config={}, fingerprint="f") is None
    assert cache.load(k) is None


# what is cached, and where ------------------------------------------------------------------------------------------
def test_models_given_as_code_are_never_cached(cache_dir, captures, two_tower):
    assert not cache.cacheable(two_tower) and not cache.cacheable(resolve_model("tiny-gpt"))
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    assert not cache.cacheable(model)
    api.plan(model, (torch.zeros(1, 8),), cluster="2xcpu", train=TINY)
    api.plan(resolve_model("tiny-gpt"), cluster="2xcpu", train=TINY)
    api.plan(two_tower, cluster="2xcpu", train=TrainConfig(global_batch=4))
    assert len(captures) == 3 and not cache_dir.exists()
    assert all(cache.cacheable(m) for m in ("tiny-gpt", "gpt3-175b", "tiny-resnet", "hf:gpt2",
                                            "llama:layers=2,hidden=64,heads=4,vocab=256,seq=32"))
    assert not any(cache.cacheable(m) for m in ("dlrm-criteo-1tb", "mypackage.models:factory", "tiny-gtp"))


def test_where_the_cache_is_and_off(monkeypatch, tmp_path, captures):
    monkeypatch.delenv(cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache.directory() == tmp_path / "xdg" / "partita" / "capture"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.directory() == tmp_path / "home" / ".cache" / "partita" / "capture"
    monkeypatch.setenv(cache.ENV, "off")
    assert cache.directory() is None and cache.key("tiny-gpt", seq=None, dtype="fp32", autocast="cpu") is None
    plan()
    plan()
    assert len(captures) == 2 and not (tmp_path / "home").exists()


def test_an_unwritable_cache_still_plans(tmp_path, monkeypatch, captures):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(cache.ENV, str(tmp_path / "file"))  # its capture/ folder cannot be made
    assert plan().mesh.world_size == 2 and captures == ["tiny-gpt"]


def test_the_session_cache_is_not_the_users():
    assert os.environ[cache.ENV] == os.environ["PARTITA_TEST_CACHE_DIR"]
    assert not Path(os.environ[cache.ENV]).resolve().is_relative_to(Path.home() / ".cache")


# what a warm plan reads without torch ---------------------------------------------------------------------
@pytest.mark.parametrize("model", [*PRESETS, *CNN_PRESETS, "gpt:layers=2,hidden=64,heads=4,vocab=256,seq=32",
                                   "llama:layers=2,hidden=64,heads=4,kv_heads=2,vocab=256,seq=32,experts=4"])
def test_torch_free_model_facts_agree_with_the_resolved_spec(model):
    spec = resolve_model(model)
    cfg = gpt_config_of(model)
    assert (cfg is not None) == (spec.config.get("family") in ("gpt", "llama"))
    if cfg is not None:
        assert cfg.as_dict() == spec.config
        assert executable.pipeline_refusal(spec) is None and executable.model_kind(spec) == "lm"
    assert executable._kind_without_torch(model) == executable.model_kind(spec)
    assert executable.pipeline_refusal_for(model) == executable.pipeline_refusal(spec)
    assert (executable.cp_refusal_for(model) is None) == (cfg is not None)


def _small_graph():
    from partita.costmodel.capture.graph import OpGraph
    graph = OpGraph(name="t", batch=1, seq_len=None, dtype="fp32")
    graph.add_node("a", module="", shape=(1, 2), params={})
    graph.add_node("b", module="", shape=(2,), params={"w": 4})
    graph.add_edge("a", "b", nbytes=8)
    return graph


def test_torchs_checkpoint_policies_are_read_from_its_source_as_torch_itself_answers():
    """Without torch imported, whether selective-checkpoint policies see op outputs is read from torch's source;
    with it imported, from the class itself: both answers agree on this torch (2.13 has op_output)."""
    code = ("import sys; from partita.planner.plan import executable as e; read = e.checkpoint_policies_see_outputs(); "
            "assert 'torch' not in sys.modules; e.checkpoint_policies_see_outputs.cache_clear(); import torch; "
            "print(read, e.checkpoint_policies_see_outputs(), e._torch_version() == torch.__version__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "True", "True"]
