"""Issue 46, "Data": HuggingFace `datasets` and dict samples as `--data` (runtime.data.datasets).

A dataset is recognised by what it can do: anything with `__getitem__` and `__len__` is map-style (a real
HuggingFace `datasets.Dataset`, a list), anything else that can be iterated afresh is iterable (a
`datasets.IterableDataset`, a plain class with `__iter__`); a DatasetDict, a generator or a number is one line.
A dict sample is matched by key onto the model's input names (an `hf:` model's input_ids and labels, a factory
model's loss_fn parameters), whatever the order of its keys; python lists of token ids become tensors; keys
the model does not take are named once in a note, unless leaving one out would change what the model computes
(a padding attention_mask); a missing key, or a model whose inputs have no names, is one line. The order
guarantees of tuple samples hold: any world size's shards make the same global batch, a fresh source resumes.
A read that fails, or a later batch whose samples differ in shape, is one line too.
"""
from __future__ import annotations

import sys
from pathlib import Path

import datasets as hf_datasets
import pytest
import torch
from torch import nn

from partita.costmodel import PartitaError, resolve_model
from partita.costmodel.models import ModelSpec
from partita.runtime.data import make_data

ROOT = Path(__file__).resolve().parents[2]
SEQ, VOCAB = 64, 1024  # hf:llama (costmodel.models.hf)


@pytest.fixture(scope="module")
def llama():
    return resolve_model("hf:llama")


@pytest.fixture(scope="module")
def cnn():
    sys.path.insert(0, str(ROOT))
    return resolve_model("examples.image_classifier:model")


def rows(n: int = 10) -> dict[str, list]:
    """Columns of n tokenized rows: row i holds token ids i, i+1, ...; its labels mask the first half (-100), so
    labels given as input_ids (or the reverse) would not pass for them; keys in another order than the model's."""
    ids = [[(i + j) % VOCAB for j in range(SEQ)] for i in range(n)]
    return {"labels": [[-100] * (SEQ // 2) + r[SEQ // 2:] for r in ids], "text": [f"row {i}" for i in range(n)],
            "attention_mask": [[1] * SEQ for _ in range(n)], "input_ids": ids}


def first_ids(batch) -> list[int]:
    return [int(x) for x in batch[0][:, 0]]


def test_a_huggingface_dataset_of_token_lists_feeds_an_hf_model_by_name(llama):
    ds = hf_datasets.Dataset.from_dict(rows())
    data = make_data(llama, 4, seed=5, path=ds)
    assert data.describe() == {"kind": "dataset", "factory": "Dataset", "samples": 10, "seed": 5}
    for step in range(4):  # 16 samples: into the second epoch
        ids, labels = data.batch(step)
        assert ids.shape == labels.shape == (4, SEQ) and ids.dtype == labels.dtype == torch.long
        for k, i in enumerate(first_ids((ids,))):
            want = torch.arange(i, i + SEQ) % VOCAB
            assert torch.equal(ids[k], want)
            assert (labels[k, :SEQ // 2] == -100).all() and torch.equal(labels[k, SEQ // 2:], want[SEQ // 2:])
        shards = [data.shard(step, r, 2) for r in range(2)]
        assert torch.equal(torch.cat([s[0] for s in shards]), ids)  # dp=2's shards are the global batch
        resumed = make_data(llama, 4, seed=5, path=hf_datasets.Dataset.from_dict(rows()))
        assert torch.equal(resumed.shard(step, 1, 2)[1], labels[2:])  # a run resumed at this step reads the same
    stream = [i for step in range(5) for i in first_ids(data.batch(step))][:10]
    assert sorted(stream) == list(range(10)) and stream != list(range(10))  # an epoch: each row once, shuffled
    loss = llama.loss_fn(llama.build(), *data.batch(0))  # the model's own loss takes the batch as it comes
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_keys_the_model_does_not_take_are_named_once(llama):
    data = make_data(llama, 4, path=hf_datasets.Dataset.from_dict(rows()))
    assert data.notes == ["note: dataset 'Dataset': model 'hf:llama' takes input_ids, labels from each sample by "
                          "key; text, attention_mask are not used (the model is planned on its inputs alone)"]
    exact = {k: v for k, v in rows().items() if k in ("input_ids", "labels")}
    assert make_data(llama, 4, path=hf_datasets.Dataset.from_dict(exact)).notes == []


def test_a_huggingface_iterable_dataset_is_read_in_its_order(llama):
    stream = hf_datasets.Dataset.from_dict(rows(6)).to_iterable_dataset()
    data = make_data(llama, 4, path=stream)
    assert data.describe()["samples"] is None  # iterable: no length
    assert [i for step in range(3) for i in first_ids(data.batch(step))] == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5]
    assert first_ids(make_data(llama, 4, path=stream).shard(2, 1, 2)) == [4, 5]  # a resumed run reads the same


class Stream:
    """An iterable that is no torch dataset: a class with __iter__, each epoch afresh."""

    def __init__(self, samples):
        self.samples = samples

    def __iter__(self):
        return iter(self.samples)


def test_any_map_style_or_iterable_object_is_a_dataset_and_its_dicts_match_the_loss_arguments(cnn):
    images = [torch.full((3, 16, 16), float(i)) for i in range(8)]
    as_tuples = [(img, i % 4) for i, img in enumerate(images)]
    as_dicts = [{"labels": i % 4, "images": img.tolist(), "id": i} for i, img in enumerate(images)]  # lists of floats
    want = make_data(cnn, 8, seed=1, path=as_tuples).batch(0)  # a plain list of tuples is map-style
    got = make_data(cnn, 8, seed=1, path=as_dicts).batch(0)  # loss_fn(module, images, labels) names them
    assert got[0].dtype == torch.float32 and all(torch.equal(a, b) for a, b in zip(got, want))
    streamed = make_data(cnn, 4, path=Stream(as_dicts)).batch(1)
    assert [int(x) for x in streamed[0][:, 0, 0, 0]] == [4, 5, 6, 7] and streamed[1].tolist() == [0, 1, 2, 3]


SPLITS = hf_datasets.DatasetDict({"train": hf_datasets.Dataset.from_dict({"x": [1]}),
                                  "test": hf_datasets.Dataset.from_dict({"x": [2]})})  # what load_dataset returns


@pytest.mark.parametrize("dataset, message", [
    (SPLITS,
     r"is of type DatasetDict \(keys 'train', 'test'\), not one dataset: give one split \(e.g. dataset\['train'\]\)"),
    ((x for x in [1, 2]), "is of type generator, an iterator that can be read only once"),
    (42, r"is of type int; give a map-style dataset \(__getitem__ and __len__: a torch Dataset, a HuggingFace "
         r"datasets.Dataset, a list\) or an iterable one"),
])
def test_what_is_no_dataset_is_one_line(cnn, dataset, message):
    with pytest.raises(PartitaError, match=message) as e:
        make_data(cnn, 8, path=dataset)
    assert "\n" not in str(e.value)


def test_a_missing_key_names_the_missing_and_the_present_keys(llama):
    no_labels = {k: v for k, v in rows().items() if k != "labels"}
    with pytest.raises(PartitaError) as e:
        make_data(llama, 4, path=hf_datasets.Dataset.from_dict(no_labels))
    assert str(e.value) == ("dataset 'Dataset' yields dicts without labels (keys: text, attention_mask, input_ids); "
                            "model 'hf:llama' takes input_ids, labels: give every sample those keys")


def test_samples_of_the_wrong_length_say_it_by_name(llama):
    short = {"input_ids": [[1, 2, 3]], "labels": [[1, 2, 3]]}
    with pytest.raises(PartitaError, match=r"yields samples \(input_ids 3 int64, labels 3 int64\), but the model "
                                           r"trains on samples \(input_ids 64 int64, labels 64 int64\)"):
        make_data(llama, 4, path=hf_datasets.Dataset.from_dict(short))


@pytest.mark.parametrize("key, value, message", [
    ("attention_mask", [1] * (SEQ - 4) + [0] * 4, "a sample's attention_mask is not 1 everywhere, but model "
                                                  "'hf:llama' takes only input_ids, labels and computes as if it were; "
                                                  "it masks padding"),
    ("token_type_ids", [0] * (SEQ // 2) + [1] * (SEQ // 2), "token_type_ids is not 0 everywhere"),
])
def test_leaving_out_a_key_that_would_change_the_result_is_refused(llama, key, value, message):
    columns = {**{k: v for k, v in rows(3).items() if k != "attention_mask"}, key: [value] * 3}
    with pytest.raises(PartitaError, match=message):
        make_data(llama, 2, path=hf_datasets.Dataset.from_dict(columns))


def test_dicts_for_a_model_whose_inputs_have_no_names_say_what_to_yield():
    with pytest.raises(PartitaError, match=r"yields dicts \(keys input_ids, labels\), but model 'tiny-gpt' does not "
                                           r"name its inputs \(a token LM: .*yield a tuple \(inputs, targets\) of "
                                           r"32 int64, 32 int64"):
        make_data(resolve_model("tiny-gpt"), 4, path=[{"input_ids": [0] * 32, "labels": [0] * 32}])
    starred = ModelSpec(name="starred", build=lambda: nn.Linear(4, 1), example_inputs=lambda b: (torch.zeros(b, 4),),
                        loss_fn=lambda module, *batch: module(*batch).sum())
    assert starred.named_inputs() is None
    with pytest.raises(PartitaError, match=r"model 'starred' does not name its inputs \(its loss_fn takes the batch as "
                                           r"\*args\): yield a tuple in the order the loss takes them \(4 float32\), "
                                           r"or give loss_fn one named parameter per input"):
        make_data(starred, 4, path=[{"x": [0.0] * 4}])
    assert make_data(starred, 2, path=[([0.0, 1.0, 2.0, 3.0],)] * 2).batch(0)[0].shape == (2, 4)  # a tuple works


class Keyed:
    """Map-style by its methods, but read by key (a pandas DataFrame's column lookup is the like of it)."""

    def __len__(self):
        return 3

    def __getitem__(self, key):
        return {"a": (torch.zeros(3, 16, 16), 0)}[key]


def test_reads_and_batches_that_fail_later_are_one_line_naming_where(cnn):
    with pytest.raises(PartitaError, match=r"dataset 'Keyed' \(Keyed\): reading sample dataset\[\d\] failed: KeyError"):
        make_data(cnn, 2, path=Keyed())
    ragged = [(torch.zeros(3, 16, 16), 0)] * 3 + [(torch.zeros(3, 8, 8), 0)]  # the first sample fits the model
    data = make_data(cnn, 2, path=Stream(ragged))
    assert data.batch(0)[0].shape == (2, 3, 16, 16)
    with pytest.raises(PartitaError, match=r"the samples of step 1 cannot be made into a batch \(RuntimeError: stack "
                                           r"expects each tensor to be equal size.*of one shape in every sample"):
        data.batch(1)
