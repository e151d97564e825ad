"""scaled_dot_product_attention with dropout is captured as the fused kernel a GPU runs (costmodel.capture.trace,
fused_attention_call): it keeps q, k, v, its output, the log-sum-exp and the generator state, never the
s x s scores, probabilities or mask that CPU's math fallback would save."""
from partita.costmodel.models import resolve_model
from partita.costmodel.capture import capture
from partita.costmodel.capture.trace import RNG_STATE_BYTES
from partita.planner.api import plan
from partita.planner.enumerate.space import SearchSpace, TrainConfig

GPT = "gpt:layers=2,hidden=128,heads=4,vocab=256,seq={seq},dropout={p}"


def _layer(seq: int, p: float) -> dict:
    """{kind: saved bytes} of the first layer of the GPT, captured in bf16 at `seq` tokens, dropout `p`."""
    graph = capture(resolve_model(GPT.format(seq=seq, p=p)), "bf16", 1)
    out: dict[str, int] = {}
    for n in graph.nodes_of("blocks.0"):
        d = graph.g.nodes[n]
        out[d["kind"]] = out.get(d["kind"], 0) + d["saved_bytes"]
    return out


def test_attention_with_dropout_saves_what_the_fused_kernel_saves_and_nothing_quadratic():
    plain, dropped = _layer(256, 0.0), _layer(256, 0.1)
    # the attention node keeps what the dropout-free fused kernel keeps, plus the generator's seed and offset
    assert dropped["scaled_dot_product_attention"] == plain["scaled_dot_product_attention"] + RNG_STATE_BYTES
    # the q, k, v projections keep their outputs for the fused kernel (math attention would save its own copies)
    assert dropped["linear"] == plain["linear"]
    # no s x s term: doubling the sequence doubles the layer's saved bytes, bar the constant generator state
    longer = _layer(512, 0.1)
    assert sum(longer.values()) - RNG_STATE_BYTES == 2 * (sum(dropped.values()) - RNG_STATE_BYTES)


def test_a_125m_gpt_with_dropout_at_micro_batch_32_fits_an_h100():
    """Captured as math attention (the s x s scores, probabilities and mask kept) it needed 278 GiB and was
    refused; as the fused kernel its activations are linear in the sequence."""
    model = "gpt:layers=12,hidden=768,heads=12,seq=2048,vocab=50304,dropout=0.1"
    p = plan(model, cluster="8xH100-80GB", train=TrainConfig(global_batch=256),
             space=SearchSpace(tp=1, pp=1, zero=0, micro_batch=32, recompute="none", offload=False))
    assert p.predicted["peak_memory_bytes"] <= p.predicted["memory_capacity_bytes"]
