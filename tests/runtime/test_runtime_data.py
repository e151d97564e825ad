"""Sample order depends on (seed, step, global batch) only: dp slices and microbatches tile the global batch."""
import pytest
import torch

from partita.costmodel import resolve_model
from partita.runtime.data import SyntheticTokens, microbatches


@pytest.fixture(scope="module")
def spec():
    return resolve_model("tiny-gpt")


@pytest.mark.parametrize("dp", [1, 2, 4, 8])
def test_dp_slices_concatenate_to_the_global_batch(spec, dp):
    data = SyntheticTokens(spec, global_batch=8, seed=3)
    for step in range(3):
        inputs, targets = data.batch(step)
        shards = [data.shard(step, r, dp) for r in range(dp)]
        assert torch.equal(torch.cat([s[0] for s in shards]), inputs)
        assert torch.equal(torch.cat([s[1] for s in shards]), targets)


def test_batch_is_tokens_shifted_by_one(spec):
    inputs, targets = SyntheticTokens(spec, global_batch=4, seed=0).batch(0)
    assert inputs.shape == targets.shape == (4, spec.seq_len)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert int(inputs.max()) < spec.vocab


def test_order_depends_on_seed_and_step_only(spec):
    a, b = SyntheticTokens(spec, 8, seed=1), SyntheticTokens(spec, 8, seed=1)
    torch.manual_seed(123)  # the global RNG does not matter
    assert torch.equal(a.batch(5)[0], b.batch(5)[0])
    assert not torch.equal(a.batch(5)[0], a.batch(6)[0])
    assert not torch.equal(a.batch(5)[0], SyntheticTokens(spec, 8, seed=2).batch(5)[0])


def test_microbatches_are_contiguous_slices(spec):
    inputs, _ = SyntheticTokens(spec, 8, seed=0).batch(0)
    mbs = microbatches(inputs, 4)
    assert [m.shape[0] for m in mbs] == [2] * 4
    assert torch.equal(torch.cat(mbs), inputs)
    with pytest.raises(ValueError):
        microbatches(inputs, 3)
