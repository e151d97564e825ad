"""Issue 30 item 3: `--data package.module:factory`, a user's torch Dataset or IterableDataset (runtime.data.datasets).

A batch depends on the seed and the step alone, as with token files: the data-parallel ranks' shards of any
world size put together are the same global batch, a source built afresh at step k (a resumed run) reads
what the uninterrupted one read, every sample of a map-style dataset is read once per epoch across the ranks,
and a dataset whose samples do not fit the model is one line before training."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

from partita.costmodel import PartitaError, resolve_model
from partita.runtime.data import make_data

ROOT = Path(__file__).resolve().parents[2]
MODEL = "examples.image_classifier:model"


@pytest.fixture(scope="module")
def cnn():
    sys.path.insert(0, str(ROOT))
    return resolve_model(MODEL)


class Numbered(Dataset):
    """Sample i: an image filled with i, and label i % 4."""

    def __init__(self, n: int = 20):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full((3, 16, 16), float(i), dtype=torch.float64), i % 4


class Stream(IterableDataset):
    def __init__(self, n: int = 7):
        self.n, self.epochs = n, []

    def set_epoch(self, epoch: int):
        self.epochs.append(epoch)

    def __iter__(self):
        return iter([(torch.full((3, 16, 16), float(i)), i % 4) for i in range(self.n)])


def ids(batch) -> list[int]:
    return [int(x) for x in batch[0][:, 0, 0, 0]]


@pytest.mark.parametrize("dataset", [Numbered, Stream], ids=["map-style", "iterable"])
def test_shards_of_any_world_size_make_the_same_global_batches_and_a_fresh_source_resumes(cnn, dataset):
    data = make_data(cnn, 8, seed=3, path=dataset())
    for step in range(6):
        whole = data.batch(step)
        assert whole[0].dtype == torch.float32 and whole[1].dtype == torch.long  # the model's example dtypes
        for dp in (2, 4):
            shards = [data.shard(step, r, dp) for r in range(dp)]
            assert ids(tuple(torch.cat(t) for t in zip(*shards))) == ids(whole)
        resumed = make_data(cnn, 8, seed=3, path=dataset())  # a run resumed at this step: a new process
        assert ids(resumed.shard(step, 1, 2)) == ids(whole)[4:]


def test_a_map_style_dataset_is_read_once_per_epoch_in_a_seeded_order(cnn):
    data = make_data(cnn, 8, seed=0, path=Numbered(20))
    stream = [i for step in range(5) for i in ids(data.batch(step))]  # 40 samples: two epochs of 20
    assert sorted(stream[:20]) == list(range(20)) and sorted(stream[20:]) == list(range(20))
    assert stream[:20] != list(range(20)) and stream[:20] != stream[20:]  # shuffled, per epoch
    assert stream == [i for step in range(5) for i in ids(make_data(cnn, 8, seed=0, path=Numbered(20)).batch(step))]
    assert stream != [i for step in range(5) for i in ids(make_data(cnn, 8, seed=1, path=Numbered(20)).batch(step))]


def test_an_iterable_dataset_is_read_in_its_order_epoch_after_epoch(cnn):
    ds = Stream(7)
    data = make_data(cnn, 4, seed=0, path=ds)
    assert [i for step in range(4) for i in ids(data.batch(step))] == [0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6, 0, 1]
    assert 2 in ds.epochs  # set_epoch told it which epoch it reads


class Wrong(Dataset):
    def __init__(self, sample):
        self.sample = sample

    def __len__(self):
        return 4

    def __getitem__(self, i):
        return self.sample


@pytest.mark.parametrize("sample, message", [
    ((torch.zeros(3, 8, 8), 1), r"yields samples \(3x8x8 float32, scalar int64\), but the model trains on samples "
                                r"\(3x16x16 float32, scalar int64\)"),
    ((torch.zeros(3, 16, 16),), r"yields samples \(3x16x16 float32\)"),
    ({"image": torch.zeros(3, 16, 16), "label": 1}, r"yields dicts without images, labels \(keys: image, label\); "
                                                     r"model 'examples.image_classifier:model' takes images, labels"),
])
def test_a_dataset_that_does_not_fit_the_model_is_one_line(cnn, sample, message):
    with pytest.raises(PartitaError, match=message):
        make_data(cnn, 8, path=Wrong(sample))


def test_a_factory_name_is_imported_and_checked(cnn, tmp_path, monkeypatch):
    data = make_data(cnn, 8, path="examples.image_classifier:dataset")
    assert data.describe() == {"kind": "dataset", "factory": "examples.image_classifier:dataset", "samples": 256,
                               "seed": 0}
    (tmp_path / "not_a_dataset.py").write_text("def factory():\n    return 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PartitaError, match=r"returned int; give a map-style dataset \(__getitem__ and __len__"):
        make_data(cnn, 8, path="not_a_dataset:factory")
    with pytest.raises(PartitaError, match="cannot import dataset factory 'no_such_module:factory'"):
        make_data(cnn, 8, path="no_such_module:factory")


def test_an_elastic_run_reads_every_sample_once_per_epoch_across_a_shrink_and_a_growth(cnn):
    """runtime.launcher.elastic keeps the global batch at every size: 3 ranks for 2 steps, then 2 (a node lost: a
    fresh source, as the restarted process makes), then 3 again. Each epoch of the 24 samples is read exactly once."""
    read = []
    for steps, dp in ((range(0, 2), 3), (range(2, 6), 2), (range(6, 10), 3)):
        data = make_data(cnn, 12, seed=5, path=Numbered(24))  # each size is a new attempt's source
        read += [i for step in steps for r in range(dp) for i in ids(data.shard(step, r, dp))]
    assert [sorted(read[e * 24:(e + 1) * 24]) for e in range(5)] == [list(range(24))] * 5
