"""Issue 46 item 3: text encoder-decoders (bart, mbart, marian, pegasus, blenderbot, blenderbot-small, plbart, mvp,
bigbird_pegasus, prophetnet) are `hf:` strings for the whole model, never their decoder alone.

transformers has a causal-LM head for each of these families too (BartForCausalLM: the decoder, its
cross-attention fed nothing); it used to be picked first, and the plan then failed at its second step under DDP
("parameters that were not used"). Each family now resolves to its sequence-to-sequence class at small defaults
and is captured whole: every parameter of the encoder and of the decoder is in the graph.
"""
import pytest
import torch

pytest.importorskip("transformers")

from partita.costmodel.errors import PartitaError  # noqa: E402
from partita.costmodel.models import resolve_model  # noqa: E402
from partita.costmodel.models.hf_seq2seq import SMALL_SEQ2SEQ  # noqa: E402

WHOLE = {"bart": "BartForConditionalGeneration", "mbart": "MBartForConditionalGeneration", "marian": "MarianMTModel",
         "pegasus": "PegasusForConditionalGeneration", "blenderbot": "BlenderbotForConditionalGeneration",
         "blenderbot-small": "BlenderbotSmallForConditionalGeneration", "plbart": "PLBartForConditionalGeneration",
         "mvp": "MvpForConditionalGeneration", "bigbird_pegasus": "BigBirdPegasusForConditionalGeneration"}


def test_the_listed_families_have_both_heads_in_transformers():
    """The premise: each family (prophetnet too) has a causal-LM head that used to be taken first."""
    from transformers.models.auto import modeling_auto as ma
    for family in [*WHOLE, "prophetnet"]:
        assert family in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, family
        assert ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES[family] == SMALL_SEQ2SEQ[family][1]


@pytest.mark.parametrize("family", WHOLE)
def test_the_family_is_planned_whole_with_the_seq2seq_loss(family, graph_of):
    spec = resolve_model(f"hf:{family}")
    assert spec.config["model"] == WHOLE[family] and spec.config["task"] == "seq2seq"
    assert spec.config["d_model"] == 128 and spec.config["vocab_size"] == 1024  # small defaults, recorded
    ids, labels = spec.example_inputs(2)
    assert ids.shape == labels.shape == (2, 64)
    with torch.device("meta"):
        model = spec.build()
    params = {n for n, _ in model.named_parameters()}
    assert any(".encoder.layers." in n for n in params) and any(".decoder.layers." in n for n in params)
    assert any("encoder_attn" in n for n in params)  # the cross-attention the decoder-only head left idle
    captured = set().union(*(d["params"] for _, d in graph_of(f"hf:{family}").g.nodes(data=True)))
    assert captured == params  # every encoder and decoder parameter is used by the captured step


def test_an_override_reaches_both_stacks_and_another_family_keeps_its_own_defaults():
    spec = resolve_model("hf:bart:encoder_layers=3,decoder_layers=1,d_model=64")
    with torch.device("meta"):
        model = spec.build()
    assert len(model.model.encoder.layers) == 3 and len(model.model.decoder.layers) == 1
    assert resolve_model("hf:mt5").config["model"] == "MT5ForConditionalGeneration"  # not a small-defaults family


def test_a_seq2seq_model_that_cannot_be_captured_is_one_line_never_its_decoder_alone():
    """ProphetNet's own `_shift_right` asserts on tensor values (`.item()`), which torch.export cannot follow:
    one line naming the whole model, not a plan of ProphetNetForCausalLM."""
    from partita.costmodel.capture import capture
    spec = resolve_model("hf:prophetnet")
    assert spec.config["model"] == "ProphetNetForConditionalGeneration"
    with pytest.raises(PartitaError) as e:
        capture(spec)
    message = str(e.value)
    assert "\n" not in message and "ProphetNetForConditionalGeneration" in message, message
    assert "its decoder alone is not planned in its place" in message and "ForCausalLM" not in message


def test_an_op_whose_output_depends_on_tensor_values_is_one_line():
    """BartForSequenceClassification counts each row's <eos> tokens with torch.unique_consecutive, whose output
    size fake tensors cannot know: a one-line refusal naming the op and the class, not DynamicOutputShapeException
    with its traceback."""
    from partita.costmodel.capture import capture
    spec = resolve_model("hf:bart-cls")
    with pytest.raises(PartitaError) as e:
        capture(spec)
    message = str(e.value)
    assert "\n" not in message and "unique_consecutive" in message and "data-dependent" in message, message
    assert "BartForSequenceClassification" in message and "depends on tensor values" in message
