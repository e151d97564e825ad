"""Token files (--data) and models with their own loss: batches depend on (seed, step, global batch) only."""
import numpy as np
import pytest
import torch

from partita.costmodel import PartitaError, resolve_model
from partita.runtime.data import SyntheticTokens, TokenFile, make_data, split_batch

GPT = resolve_model("tiny-gpt")  # vocab 256, seq 32
VOCAB, SEQ = GPT.vocab, GPT.seq_len


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The same 5,000 tokens as raw uint16, raw uint32, .npy (int32) and an np.memmap-written file."""
    d = tmp_path_factory.mktemp("tokens")
    tokens = np.random.default_rng(0).integers(0, VOCAB, size=5_000)
    tokens.astype("<u2").tofile(d / "t16.bin")
    tokens.astype("<u4").tofile(d / "t32.bin")
    np.save(d / "t.npy", tokens.astype(np.int32))
    mm = np.memmap(d / "mm.bin", dtype="<u2", mode="w+", shape=tokens.shape)
    mm[:] = tokens
    mm.flush()
    return {"t16": (d / "t16.bin", None), "t32": (d / "t32.bin", "uint32"), "npy": (d / "t.npy", None),
            "memmap": (d / "mm.bin", "uint16")}, tokens


@pytest.mark.parametrize("kind", ["t16", "t32", "npy", "memmap"])
def test_dp_slices_of_a_token_file_concatenate_to_the_global_batch(files, kind):
    paths, tokens = files
    path, dtype = paths[kind]
    data = TokenFile(path, GPT, global_batch=8, seed=5, dtype=dtype)
    for step in (0, 1, 7):
        inputs, targets = data.batch(step)
        assert inputs.shape == targets.shape == (8, SEQ) and inputs.dtype == torch.long
        assert torch.equal(inputs[:, 1:], targets[:, :-1])
        for dp in (1, 2, 4, 8):
            shards = [data.shard(step, r, dp) for r in range(dp)]
            assert torch.equal(torch.cat([s[0] for s in shards]), inputs)
            assert torch.equal(torch.cat([s[1] for s in shards]), targets)
        for row, start in zip(inputs, data.starts(step)):  # each sample is a window of the file
            assert torch.equal(row, torch.from_numpy(tokens[start:start + SEQ].astype(np.int64)))


def test_token_file_order_depends_on_seed_and_step_only(files):
    paths, _ = files
    a = TokenFile(paths["t16"][0], GPT, 8, seed=1)
    b = TokenFile(paths["npy"][0], GPT, 8, seed=1)  # same tokens, other format
    np.random.seed(3)
    torch.manual_seed(3)  # global RNGs do not matter
    assert torch.equal(a.batch(4)[0], b.batch(4)[0])
    assert not torch.equal(a.batch(4)[0], a.batch(5)[0])
    assert not torch.equal(a.batch(4)[0], TokenFile(paths["t16"][0], GPT, 8, seed=2).batch(4)[0])
    # a larger global batch draws other offsets: the batch is a function of the global batch too
    assert TokenFile(paths["t16"][0], GPT, 16, seed=1).batch(4)[0].shape == (16, SEQ)


def test_token_file_errors_are_one_line(tmp_path):
    def fails(match, path, spec=GPT, **kw):
        with pytest.raises(PartitaError, match=match) as e:
            TokenFile(path, spec, 4, **kw)
        assert "\n" not in str(e.value)

    fails("does not exist", tmp_path / "none.bin")
    np.array([1, 2, 3], dtype="<u2").tofile(tmp_path / "short.bin")
    fails("one sample needs 33", tmp_path / "short.bin")
    (tmp_path / "odd.bin").write_bytes(b"\x01\x02\x03")
    fails("not a whole number of uint16", tmp_path / "odd.bin")
    np.full(100, 300, dtype="<u2").tofile(tmp_path / "big.bin")
    fails("token id 300, outside model 'tiny-gpt'.s vocabulary of 256", tmp_path / "big.bin")
    np.save(tmp_path / "f.npy", np.zeros(100, dtype=np.float32))
    fails("1-D integer token array", tmp_path / "f.npy")
    fails("--data-dtype applies to raw", tmp_path / "f.npy", dtype="uint32")
    with pytest.raises(PartitaError, match="needs --data"):
        make_data(GPT, 4, 0, None, "uint32")
    fails(r"is a directory: give one token file \(.npy, or raw .* or package.module:factory returning a dataset "
          r"\(a saved HuggingFace dataset folder: a factory returning datasets.load_from_disk\(folder\)\)", tmp_path)
    # text given as tokens: each way it fails says to tokenize it; token ids never get that hint
    hint = "it looks like text: --data takes token ids, so tokenize it first"
    for name, text in (("short.txt", "hello world"), ("odd.txt", "hello world, hello."), ("long.txt", "the fox. " * 50)):
        (tmp_path / name).write_text(text)
        fails(hint, tmp_path / name)
    for name in ("short.bin", "odd.bin", "big.bin"):
        with pytest.raises(PartitaError) as e:
            TokenFile(tmp_path / name, GPT, 4)
        assert hint not in str(e.value)


@pytest.fixture(scope="module")
def hf_llama():
    return resolve_model("hf:llama")  # vocab 1024 (config), seq 64, loss_fn = the model's own loss


def test_models_with_their_own_loss_get_random_token_batches_shaped_like_their_example(hf_llama):
    data = SyntheticTokens(hf_llama, global_batch=4, seed=0)
    ids, labels = data.batch(0)
    assert ids.shape == labels.shape == (4, 64) and ids.dtype == torch.long
    assert torch.equal(ids, labels)  # HF causal LMs shift the labels themselves
    assert len(ids.unique()) > 100 and int(ids.max()) < 1024
    assert not torch.equal(ids, data.batch(1)[0])
    shards = [data.shard(0, r, 2) for r in range(2)]
    assert torch.equal(torch.cat([s[0] for s in shards]), ids)
    for mb in split_batch(data.batch(0), 2):
        assert len(mb) == 2 and mb[0].shape == (2, 64)


def test_a_token_file_feeds_a_model_with_its_own_loss(files, hf_llama):
    paths, tokens = files
    data = TokenFile(paths["t16"][0], hf_llama, global_batch=4, seed=0)
    ids, labels = data.batch(2)
    start = data.starts(2)[0]
    assert torch.equal(ids, labels) and torch.equal(ids[0], torch.from_numpy(tokens[start:start + 64].astype(np.int64)))
    loss = hf_llama.loss_fn(hf_llama.build(), ids, labels)
    assert loss.ndim == 0 and torch.isfinite(loss)
