"""`gpt:` and `llama:` MODEL strings take every GPTConfig field, parsed by its type, so a published run is
priced as it ran; bad input is one clear line naming the key and what is accepted."""
import dataclasses

import pytest
import torch

from partita.costmodel.errors import PartitaError
from partita.costmodel.models import resolve_model
from partita.costmodel.models.gpt import GPTConfig


def test_every_gptconfig_field_is_a_key():
    keys = {f.name for f in dataclasses.fields(GPTConfig)} - {"family"}
    spec = resolve_model("llama:layers=3,hidden=64,heads=4,vocab=300,seq=48,ffn=100,kv_heads=2,attention=math,"
                         "dropout=0.25,loss=fused,experts=4,top_k=1")
    assert set(spec.config) - {"family"} == keys
    assert spec.config == {"layers": 3, "hidden": 64, "heads": 4, "vocab": 300, "seq": 48, "ffn": 100,
                           "kv_heads": 2, "family": "llama", "attention": "math", "dropout": 0.25, "loss": "fused",
                           "experts": 4, "top_k": 1}
    assert isinstance(spec.config["dropout"], float) and isinstance(spec.config["layers"], int)


def test_a_published_run_is_priced_as_it_ran():
    spec = resolve_model("gpt:layers=96,hidden=12288,heads=96,seq=2048,vocab=51200,attention=math,dropout=0.1")
    assert spec.config == {**resolve_model("megatron-146b").config, "layers": 96}  # the same implementation
    with torch.device("meta"):
        model = spec.build()
    assert model.blocks[0].attn.math and model.blocks[0].attn.p == 0.1 and model.blocks[0].mlp.p == 0.1


def test_gpt_takes_kv_heads_and_defaults_stay():
    cfg = resolve_model("gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256,kv_heads=2").config
    assert cfg["kv_heads"] == 2 and cfg["ffn"] == 256 and cfg["attention"] == "sdpa" and cfg["dropout"] == 0.0


BASE = "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256"


@pytest.mark.parametrize("spec,needle", [
    (BASE + ",foo=1", "bad model parameter 'foo=1'"),
    (BASE + ",layers", "use key=value with keys layers, hidden, heads, vocab, seq, ffn, kv_heads, attention, dropout"),
    ("gpt:layers=two,hidden=64,heads=4,seq=32,vocab=256", "model parameter layers='two'"),
    ("gpt:layers=2.5,hidden=64,heads=4,seq=32,vocab=256", "is not an integer"),
    (BASE + ",attention=flash", "attention='flash' in"),
    (BASE + ",attention=flash", "accepted values sdpa|math"),
    (BASE + ",dropout=lots", "dropout='lots'"),
    (BASE + ",dropout=lots", "is not a number"),
    (BASE + ",dropout=1.5", "dropout must be in [0, 1)"),
    (BASE + ",heads=3", "is given twice"),
    ("gpt:layers=2,hidden=64", "is missing ['heads', 'vocab', 'seq']"),
    ("llama:layers=2,hidden=64,heads=4,seq=32,vocab=256,kv_heads=3", "divisible by kv_heads"),
])
def test_bad_family_strings_are_one_clear_line(spec, needle):
    with pytest.raises(PartitaError) as e:
        resolve_model(spec)
    msg = str(e.value)
    assert needle in msg and "\n" not in msg


def test_the_listings_name_the_keys(capsys):
    from partita.cli import main
    assert main(["models"]) == 0
    out = capsys.readouterr().out
    assert "attention=sdpa|math" in out and "dropout=" in out and "kv_heads" in out
    with pytest.raises(PartitaError, match=r"attention=sdpa\|math,dropout=.*llama:\.\.\. \(the same keys\)"):
        resolve_model("nope")
