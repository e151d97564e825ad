"""Issue 46 item 8: `hf:clip` and `hf:siglip` are HuggingFace dual encoders trained on their own contrastive loss
(costmodel.models.hf_dual): texts and images in, the model's `loss` out, its towers' sizes set by dotted overrides.
Their loss scores every text of a batch against every image, and the fake-tensor coupling check says so (the plan
then warns what --dp does to it)."""
import pytest
import torch

pytest.importorskip("transformers")

from partita.costmodel.capture import coupling  # noqa: E402
from partita.costmodel.errors import PartitaError  # noqa: E402
from partita.costmodel.models import resolve_model  # noqa: E402


@pytest.mark.parametrize("name,model", [("hf:clip", "CLIPModel"), ("hf:siglip", "SiglipModel")])
def test_a_dual_encoder_trains_on_its_contrastive_loss_over_texts_and_images(name, model):
    spec = resolve_model(name)
    assert spec.config["model"] == model and spec.config["task"] == "contrastive"
    assert spec.input_names == ("input_ids", "pixel_values")
    ids, pixels = spec.example_inputs(3)
    assert ids.shape == (3, 64) and ids.dtype == torch.long and pixels.shape == (3, 3, 32, 32)
    module = spec.build()
    torch.manual_seed(0)
    ids, pixels = torch.randint(0, 1024, (4, 64)), torch.randn(4, 3, 32, 32)
    loss = spec.loss_fn(module, ids, pixels)
    assert loss.ndim == 0 and loss.requires_grad
    # the loss reads the pairing: the same texts against shuffled images score differently
    assert not torch.allclose(loss, spec.loss_fn(module, ids, pixels[[1, 0, 3, 2]]))


def test_the_loss_is_found_to_couple_the_samples_of_a_batch():
    why = coupling.find(resolve_model("hf:clip"))
    assert why is not None and "batch squared" in why, why


def test_tower_overrides_are_dotted_and_seq_sets_the_text_positions():
    spec = resolve_model("hf:clip:vision_config.image_size=48,text_config.num_hidden_layers=3,projection_dim=32,seq=96")
    module = spec.build()
    assert module.config.vision_config.image_size == 48 and module.config.projection_dim == 32
    assert len(module.text_model.encoder.layers) == 3 and len(module.vision_model.encoder.layers) == 2
    assert module.config.text_config.max_position_embeddings == 96
    assert spec.example_inputs(1)[1].shape == (1, 3, 48, 48) and spec.example_inputs(1)[0].shape == (1, 96)
    assert spec.config["vision_config.image_size"] == 48 and spec.config["vocab_size"] == 1024


@pytest.mark.parametrize("spec,says", [
    ("hf:clip:audio_config.hidden_size=64", "no tower 'audio_config'"),
    ("hf:clip:text_config.hiden_size=64", "no text_config attribute 'hiden_size'"),
    ("hf:clip:text_config.max_position_embeddings=32,seq=64", "seq=64 exceeds text_config.max_position_embeddings=32"),
])
def test_a_bad_tower_override_is_one_line(spec, says):
    with pytest.raises(PartitaError, match=says):
        resolve_model(spec)
