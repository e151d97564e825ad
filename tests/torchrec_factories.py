"""A TorchRec user's recommendation model as a `module:factory` MODEL string, for tests: TorchRec's own DLRM
(torchrec.models.dlrm) over an EmbeddingBagCollection built on the meta device, as TorchRec users build it,
with a KeyedJaggedTensor input. No partita code; needs `partita[rec]`.

    partita plan --model torchrec_factories:dlrm ...      # with tests/ on sys.path

Four tables: `t_items` is shared by features `item` and `seen`; `t_users`, `t_ads` and `t_tags` pool one feature
each (`user`, `ad`, `tag`). Samples hold 1 to 3 IDs per feature, 2 on average.
torchrec is imported at the top, as users do: importing it under the meta device (as the factory is probed)
fails inside tensordict.
"""
import torch
import torch.nn.functional as F
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.models.dlrm import DLRM

DENSE, DIM = 4, 8
POOLING = {"user": 2, "item": 1, "seen": 3, "ad": 1, "tag": 3}


def click_loss(model, dense, sparse):
    logits = model(dense, sparse).squeeze(1)
    return F.binary_cross_entropy_with_logits(logits, torch.zeros_like(logits))


def dlrm(batch: int = 2, users: int = 1000, items: int = 500):
    tables = [EmbeddingBagConfig(name="t_users", embedding_dim=DIM, num_embeddings=users, feature_names=["user"]),
              EmbeddingBagConfig(name="t_items", embedding_dim=DIM, num_embeddings=items,
                                 feature_names=["item", "seen"]),
              EmbeddingBagConfig(name="t_ads", embedding_dim=DIM, num_embeddings=300, feature_names=["ad"]),
              EmbeddingBagConfig(name="t_tags", embedding_dim=DIM, num_embeddings=200, feature_names=["tag"])]
    model = DLRM(embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=torch.device("meta")),
                 dense_in_features=DENSE, dense_arch_layer_sizes=[16, DIM], over_arch_layer_sizes=[16, 1])
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=list(POOLING), values=torch.zeros(batch * sum(POOLING.values()), dtype=torch.long),
        lengths=torch.tensor([p for p in POOLING.values() for _ in range(batch)], dtype=torch.int32))
    return model, (torch.zeros(batch, DENSE), kjt), click_loss


def big():
    """The same model with 2e9-row tables (64 GB each in fp32): planned without allocating them."""
    return dlrm(users=2_000_000_000, items=2_000_000_000)


class Tower(torch.nn.Module):
    """A collection, a gain of its own and a projection of the pooled vectors in one part of the model."""

    def __init__(self, ebc: EmbeddingBagCollection):
        super().__init__()
        self.ebc = ebc
        self.gain = torch.nn.Parameter(torch.ones(DIM))
        self.proj = torch.nn.Linear(DIM, DIM)

    def forward(self, kjt):
        pooled = self.ebc(kjt).to_dict()
        return self.proj(torch.stack([pooled[k] for k in sorted(pooled)], dim=1) * self.gain).flatten(1)


class TowerModel(torch.nn.Module):
    def __init__(self, ebc: EmbeddingBagCollection):
        super().__init__()
        self.tower = Tower(ebc)
        self.top = torch.nn.Sequential(torch.nn.Linear(DENSE + 5 * DIM, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, dense, kjt):
        return self.top(torch.cat([dense, self.tower(kjt)], dim=1))


def tower(batch: int = 2):
    """The same tables and input under a model whose tower holds the collection beside a gain and a projection:
    under a sharded dense plan the projection is an FSDP unit, the gain (held by the module around the collection)
    neither FSDP's nor TorchRec's (runtime.rec.run.replicated_by_hand)."""
    model, inputs, loss = dlrm(batch)
    return TowerModel(model.sparse_arch.embedding_bag_collection), inputs, loss
