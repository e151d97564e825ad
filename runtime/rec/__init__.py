"""Plans with embedding tables on TorchRec: the model split into its ID part and dense part and sharded by
DistributedModelParallel as the plan says (`shard`), and its training loop with --verify's comparison (`run`)."""
from partita.costmodel.lazy import submodules


__getattr__ = submodules(__name__)  # a submodule loads on first use, as an attribute too
