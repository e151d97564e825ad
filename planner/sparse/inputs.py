"""What a user gives about a model's embedding tables (`partita plan --data/--zipf/--pooling/...`, the API's
`sparse=`): SparseInputs. Torch-free, so `partita plan`'s flags are generated from its fields without importing
the tables' solver (planner.sparse.rec_plan runs it)."""
from __future__ import annotations

from dataclasses import dataclass, field

from partita.costmodel.errors import PartitaError
from partita.costmodel.sparse.names import PLACEMENTS, PRICINGS, SHARDINGS, SPARSE_OPTIMIZERS
from partita.costmodel.fields import flag, no_flag

REC = "recommendation models (models with nn.EmbeddingBag tables or a TorchRec EmbeddingBagCollection, e.g. " \
      "dlrm-criteo-1tb)"
"""The group of SparseInputs' flags in `partita plan --help`."""


@dataclass(frozen=True, kw_only=True)
class SparseInputs:
    """The data and choices of the sparse part (`partita plan --data/--zipf/--pooling/...`)."""

    data: str | None = field(default=None, metadata=flag(
        "a sample of the sparse features: .npz with one array of IDs per table (named as its module, or a TorchRec "
        "table by its config name) and optionally NAME.lengths (IDs per sample)", metavar="FILE", group=REC))
    """A sample of the sparse features (.npz, costmodel.sparse.embeddings.load_sample)."""
    zipf: float | None = field(default=None, metadata=flag(
        "IDs Zipf-distributed with exponent ALPHA over each table's rows (default without --data: uniform)",
        metavar="ALPHA", group=REC))
    """IDs Zipf-distributed with this exponent over each table's rows; neither given: uniform (alpha 0)."""
    pooling: float | None = field(default=None, metadata=flag(
        "IDs per sample and feature with --zipf (default: the model's example batch)", metavar="L", group=REC))
    """IDs per sample and feature under --zipf; default: the model's example batch's."""
    optimizer: str = field(default="rowwise_adagrad", metadata=flag(
        "the tables' fused optimizer (default rowwise_adagrad)", option="sparse-optimizer", dest="sparse_optimizer",
        choices=SPARSE_OPTIMIZERS, group=REC))
    fixed: str | None = field(default=None, metadata=flag(
        f"fix tables' sharding ({', '.join(s + (':K' if s == 'column_wise' else '') for s in SHARDINGS)}) and "
        f"placement ({', '.join(PLACEMENTS)}); TABLE * for every table", option="embedding-sharding",
        dest="embedding_sharding", metavar="TABLE=SHARDING[:K][@PLACEMENT],...", group=REC))
    """`TABLE=SHARDING[:K][@PLACEMENT],...` (planner.sparse.embeddings.parse_fixed)."""
    time_limit: float = field(default=60.0, metadata=no_flag("a guard of the tables' solve, not a choice"))
    pricing: str = field(default="partita", metadata=flag(
        "who prices the tables: partita's byte model (default), or TorchRec's own estimator (EmbeddingPerfEstimator; "
        "the program then minimises what TorchRec's planner does)", option="embedding-costs", dest="embedding_costs",
        choices=PRICINGS, group=REC))
    """Who prices the table pieces: partita's byte model, or TorchRec's estimator (costmodel.sparse.torchrec_costs)."""

    def __post_init__(self):
        if self.pricing not in PRICINGS:
            raise PartitaError(f"--embedding-costs {self.pricing!r}; accepted: {', '.join(PRICINGS)}")
        if self.optimizer not in SPARSE_OPTIMIZERS:
            raise PartitaError(f"sparse optimizer {self.optimizer!r}; accepted: {', '.join(SPARSE_OPTIMIZERS)}")
        if self.data is not None and (self.zipf is not None or self.pooling is not None):
            raise PartitaError("--data gives the ID distribution and pooling; drop --zipf / --pooling")
