"""Text encoder-decoders as `hf:` strings: small defaults, so that they plan (and their tests run) fast.

transformers gives these model types a causal-LM head too (BartForCausalLM: the decoder alone, its
cross-attention fed nothing). `hf:FAMILY` trains the whole encoder-decoder instead (costmodel.models.hf tries
the sequence-to-sequence head first): its ForConditionalGeneration class on (input_ids, labels), the decoder
inputs made by the model from the labels (shifted right, each family's own `shift_tokens_right`), the loss the
mean token cross-entropy over the labels -- as hf:t5. Planning only the decoder left the encoder and the
cross-attention unused, which DDP refuses at its second step ("parameters that were not used").

The sizes below are those of hf:t5's defaults (2 + 2 layers, hidden 128, 4 heads, feed-forward 512, vocabulary
1024, 64 positions, no dropout); any of them can be overridden (`hf:bart:d_model=256`). A default special
token id outside the small vocabulary (Marian's pad 58100) becomes its last id (costmodel.models.hf._config).
"""
from __future__ import annotations

from typing import Any

_BART_STYLE: dict[str, Any] = dict(
    d_model=128, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
    encoder_ffn_dim=512, decoder_ffn_dim=512, vocab_size=1024, max_position_embeddings=64,
    dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
"""The size attributes of BART and the configs derived from it (mBART, Marian, Pegasus, Blenderbot, PLBart, MVP,
BigBird-Pegasus)."""

_PROPHETNET: dict[str, Any] = dict(
    hidden_size=128, num_encoder_layers=2, num_decoder_layers=2, num_encoder_attention_heads=4,
    num_decoder_attention_heads=4, encoder_ffn_dim=512, decoder_ffn_dim=512, vocab_size=1024,
    max_position_embeddings=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)

SMALL_SEQ2SEQ: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bart": ("BartConfig", "BartForConditionalGeneration", _BART_STYLE),
    "mbart": ("MBartConfig", "MBartForConditionalGeneration", _BART_STYLE),
    "marian": ("MarianConfig", "MarianMTModel", _BART_STYLE),
    "pegasus": ("PegasusConfig", "PegasusForConditionalGeneration", _BART_STYLE),
    "blenderbot": ("BlenderbotConfig", "BlenderbotForConditionalGeneration", _BART_STYLE),
    "blenderbot-small": ("BlenderbotSmallConfig", "BlenderbotSmallForConditionalGeneration", _BART_STYLE),
    "plbart": ("PLBartConfig", "PLBartForConditionalGeneration", _BART_STYLE),
    "mvp": ("MvpConfig", "MvpForConditionalGeneration", _BART_STYLE),
    # block-sparse attention needs sequences longer than (5 + 2 x num_random_blocks) x block_size = 704 tokens;
    # below that BigBird switches itself to full attention in its first forward (a warning and a module change)
    "bigbird_pegasus": ("BigBirdPegasusConfig", "BigBirdPegasusForConditionalGeneration",
                        {**_BART_STYLE, "attention_type": "original_full"}),
    "prophetnet": ("ProphetNetConfig", "ProphetNetForConditionalGeneration", _PROPHETNET),
}
"""hf:FAMILY -> (config class, sequence-to-sequence LM class, small defaults)."""
