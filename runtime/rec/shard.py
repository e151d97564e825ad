"""TorchRec's side of a plan with embedding tables: the model split by torch.fx into table inputs and a dense
part, the tables as one EmbeddingBagCollection sharded by the plan, and FSDP2 or DDP for the rest
(runtime.rec.run's docstring says how; rec.run trains with them)."""
from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.fx as fx
import torch.nn as nn

from partita.costmodel import PartitaError
from partita.costmodel.sparse.embeddings import find_tables, table_modules
from partita.costmodel.sparse.kjt import KJT_PREFIX, is_ebc
from partita.costmodel.sparse.costs import TORCHREC_KERNELS
from partita.planner.plan import Plan, PlanError

ADAGRAD_EPS = 1e-8


def require_torchrec() -> None:
    try:
        import fbgemm_gpu  # noqa: F401
        import torchrec  # noqa: F401
    except Exception as e:  # noqa: BLE001 -- ImportError, or fbgemm's own load errors
        raise PartitaError(f"this plan has embedding tables, which run through TorchRec: pip install 'partita[rec]' "
                           f"and then pip install --no-deps torchrec==1.8.0 (on GPU hosts: pip install torchrec "
                           f"fbgemm-gpu) ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None


def table_key(fqn: str) -> str:
    """The TorchRec table and feature name of the table at module `fqn`."""
    return fqn.replace(".", "__")


# ----------------------------------------------------------------------------------------------- the split

class _Tracer(fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, nn.EmbeddingBag) or super().is_leaf_module(m, qualname)


def split(model: nn.Module) -> tuple[fx.GraphModule, fx.GraphModule, list[str]]:
    """(ids, dense, table FQNs in call order): module docstring."""
    graph = _Tracer().trace(model)
    calls = [n for n in graph.nodes if n.op == "call_module"
             and isinstance(model.get_submodule(n.target), nn.EmbeddingBag)]
    names = [n.target for n in calls]
    if len(set(names)) != len(names):
        raise PlanError("a table is looked up twice in one forward; TorchRec pools each feature once")
    for n in calls:
        if len(n.args) != 1 or n.kwargs:
            raise PlanError(f"table {n.target} is called with offsets or weights; the TorchRec runtime takes "
                            "(batch, IDs per sample) inputs")
    ids_graph = copy.deepcopy(graph)
    ids_calls = [n for n in ids_graph.nodes if n.op == "call_module" and n.target in names]
    out = next(n for n in ids_graph.nodes if n.op == "output")
    out.args = (tuple(n.args[0] for n in ids_calls),)
    for n in ids_calls:
        n.replace_all_uses_with(n.args[0])
        ids_graph.erase_node(n)
    last_input = [n for n in graph.nodes if n.op == "placeholder"][-1]
    with graph.inserting_after(last_input):
        pooled = []
        for _ in calls:  # each inserted right after the inputs: created last-first, they end in call order
            pooled.insert(0, graph.placeholder(f"pooled_{len(calls) - 1 - len(pooled)}"))
    for n, p in zip(calls, pooled):
        n.replace_all_uses_with(p)
        graph.erase_node(n)
    out = []
    for g in (ids_graph, graph):
        gm = fx.GraphModule(model, g)
        gm.graph.eliminate_dead_code()
        gm.recompile()
        out.append(gm)
    return out[0], out[1], names


class _Sparse(nn.Module):
    def __init__(self, ebc: nn.Module):
        super().__init__()
        self.ebc = ebc

    def forward(self, kjt):
        return self.ebc(kjt)


class RecModel(nn.Module):
    """ids -> the sharded tables (DistributedModelParallel) -> the dense part (DDP, or FSDP2 units)."""

    def __init__(self, ids: fx.GraphModule, dense: nn.Module, sparse: nn.Module, keys: list[str]):
        super().__init__()
        self.ids, self.dense, self.sparse, self.keys = ids, dense, sparse, keys

    def forward(self, *inputs):
        from torchrec import KeyedJaggedTensor
        per_table = self.ids(*inputs)
        batch, pooling = per_table[0].shape[0], [t.shape[1] for t in per_table]
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=self.keys, values=torch.cat([t.reshape(-1) for t in per_table]),
            lengths=torch.cat([torch.full((batch,), p, dtype=torch.int32) for p in pooling]))
        out = self.sparse(kjt)
        pooled = out.wait().to_dict() if hasattr(out, "wait") else out.to_dict()
        return self.dense(*inputs, *(pooled[k] for k in self.keys))


# ---------------------------------------------------------------------------------------- sharding

def kernel(table: dict, device_type: str) -> str:
    """TorchRec's compute kernel for a planned table: its placement's on GPUs, FBGEMM's CPU kernel on CPU."""
    if table["sharding"] == "data_parallel":
        return "dense"
    return TORCHREC_KERNELS[table.get("placement", "hbm")] if device_type == "cuda" else "fused"


def _generators(plan: Plan, device_type: str) -> dict:
    from torchrec.distributed.sharding_plan import column_wise, data_parallel, row_wise, table_row_wise, table_wise
    out = {}
    per_node = plan.cluster.get("devices_per_node") or plan.mesh.world_size
    for t in plan.embeddings["tables"]:
        kind, ranks = t["sharding"], t["ranks"]
        k = kernel(t, device_type)
        out[table_key(t["name"])] = {
            "data_parallel": lambda: data_parallel(),
            "table_wise": lambda: table_wise(rank=ranks[0], compute_kernel=k),
            "column_wise": lambda: column_wise(ranks=list(ranks), compute_kernel=k),
            "row_wise": lambda: row_wise(compute_kernel=k),
            "table_row_wise": lambda: table_row_wise(host_index=ranks[0] // per_node),
        }[kind]()
    return out


def fused_params(optimizer: str, lr: float) -> dict:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    kind = {"sgd": EmbOptimType.EXACT_SGD, "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
            "adam": EmbOptimType.ADAM}[optimizer]
    return {"optimizer": kind, "learning_rate": lr, "eps": ADAGRAD_EPS}


def _module_plan(plan: Plan, ebc: nn.Module, generators: dict, device: torch.device, keys: dict[str, str]) -> dict:
    """TorchRec's per-table ParameterSharding of one collection; `keys`: its tables' names -> plan names."""
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import CacheParams
    world = dist.get_world_size()
    per_node = plan.cluster.get("devices_per_node") or world
    module_plan = construct_module_sharding_plan(ebc, generators, local_size=min(per_node, world), world_size=world,
                                                 device_type=device.type)
    tables = {t["name"]: t for t in plan.embeddings["tables"]}
    for key, name in keys.items():  # table_row_wise's generator takes no kernel: every table gets its own
        t = tables[name]
        module_plan[key].compute_kernel = kernel(t, device.type)
        if t.get("placement") == "cache" and device.type == "cuda":
            module_plan[key].cache_params = CacheParams(load_factor=t["cache_fraction"])
    return module_plan


def _set_local_world(plan: Plan) -> None:
    # TorchRec finds its nodes (table_row_wise's host groups) by LOCAL_WORLD_SIZE: the plan's node size, also
    # where one host runs several of the plan's nodes (CPU tests)
    world = dist.get_world_size()
    os.environ["LOCAL_WORLD_SIZE"] = str(min(plan.cluster.get("devices_per_node") or world, world))


def _sharder(plan: Plan, lr: float):
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    return EmbeddingBagCollectionSharder(fused_params=fused_params(plan.embeddings.get("optimizer", "sgd"), lr))


def shard_collections(plan: Plan, model: nn.Module, device: torch.device, lr: float) -> nn.Module:
    """A TorchRec model (costmodel.sparse.kjt.KJTModel) in DistributedModelParallel, as TorchRec users run it: each
    EmbeddingBagCollection sharded in place by the plan, the rest wrapped in DDP by TorchRec's default
    data-parallel wrapper; a model built whole (--verify) gets its tables' values copied into the pieces."""
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingPlan
    _set_local_world(plan)
    by_collection: dict[str, dict[str, str]] = {}
    for t in find_tables(model):
        by_collection.setdefault(t.collection, {})[t.key] = t.name
    generators = _generators(plan, device.type)
    plans = {}
    for collection, keys in by_collection.items():
        fqn = KJT_PREFIX + collection if collection else KJT_PREFIX.rstrip(".")  # a collection the factory returned
        own = {k: generators[table_key(n)] for k, n in keys.items()}
        plans[fqn] = _module_plan(plan, model.get_submodule(fqn), own, device, keys)
    weights = {name: m.weight for name, m in table_modules(model).items()}
    sharded_dense = plan.zero_stage == 3 and dist.get_world_size() > 1
    dmp = DistributedModelParallel(model, device=device, plan=ShardingPlan(plans), sharders=[_sharder(plan, lr)],
                                   init_data_parallel=not sharded_dense)
    if not any(w.is_meta for w in weights.values()):
        _copy_weights(dmp, weights)
    if sharded_dense:
        from torchrec.distributed.types import ShardedModule
        # FSDP units hold no collection nor any part of one: a unit takes every parameter below it; a module
        # around a collection keeps its own parameters replicated (replicated_by_hand)
        inside = {id(m) for c in model.modules() if isinstance(c, ShardedModule) for m in c.modules()}
        _fully_shard([m for m in model.modules() if id(m) not in inside
                      and not any(isinstance(x, ShardedModule) for x in m.modules())], device)
        dmp._partita_sharded_dense = True
    return dmp


def shard(plan: Plan, model: nn.Module, device: torch.device, lr: float) -> nn.Module:
    """`model` (real, the same on every rank) with its tables sharded by the plan (weights copied where it was
    built whole): a RecModel, or for a TorchRec model its DistributedModelParallel (shard_collections)."""
    if any(is_ebc(m) for m in model.modules()):
        return shard_collections(plan, model, device, lr)
    from torch.nn.parallel import DistributedDataParallel
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingPlan
    world = dist.get_world_size()
    _set_local_world(plan)
    ids, dense, order = split(model)
    tables = {fqn: model.get_submodule(fqn) for fqn in order}
    configs = [EmbeddingBagConfig(name=table_key(fqn), embedding_dim=m.embedding_dim, num_embeddings=m.num_embeddings,
                                  feature_names=[table_key(fqn)], data_type=_data_type(m.weight.dtype),
                                  pooling=PoolingType.SUM if m.mode == "sum" else PoolingType.MEAN)
               for fqn, m in tables.items()]
    sparse = _Sparse(EmbeddingBagCollection(tables=configs, device=torch.device("meta")))
    module_plan = _module_plan(plan, sparse.ebc, _generators(plan, device.type), device,
                               {table_key(t["name"]): t["name"] for t in plan.embeddings["tables"]})
    dmp = DistributedModelParallel(sparse, device=device, plan=ShardingPlan({"ebc": module_plan}),
                                   sharders=[_sharder(plan, lr)])
    if not any(m.weight.is_meta for m in tables.values()):  # a model built whole: its tables' values
        _copy_weights(dmp, {fqn: m.weight for fqn, m in tables.items()})
    if world > 1 and any(True for _ in dense.parameters()):
        if plan.zero_stage == 3:
            _fully_shard(list(dense.modules()), device)
        else:
            dense = DistributedDataParallel(dense)
    return RecModel(ids, dense, dmp, [table_key(f) for f in order])


def _fully_shard(modules: list[nn.Module], device: torch.device) -> None:
    """FSDP2 over every rank (the plan's dense part sharded, ZeRO-3): each module holding parameters of its own
    (a Linear, a norm) is its own unit, so one layer's parameters are gathered at a time, as the planner prices
    ZeRO-3 (a layer ahead prefetched). fp32, as the replicated dense part runs."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for m in modules:
        if any(True for _ in m.parameters(recurse=False)):
            fully_shard(m, mesh=mesh)


def replicated_by_hand(rec: nn.Module) -> list[nn.Parameter]:
    """Parameters of a TorchRec model under a sharded dense plan that neither FSDP nor TorchRec holds (should a
    module keep parameters FSDP left replicated): their gradients are averaged over the ranks after each backward
    (runtime.parallel.apply.average_grads), as DDP would. TorchRec's sharded collection keeps its data_parallel tables in
    its own DDP (ShardedEmbeddingBagCollection.init_data_parallel) and updates the rest in its backward."""
    from torch.distributed.tensor import DTensor
    from torchrec.distributed.types import ShardedModule
    if not getattr(rec, "_partita_sharded_dense", False) or dist.get_world_size() == 1:
        return []
    torchrecs = {id(p) for m in rec.modules() if isinstance(m, ShardedModule) for p in m.parameters()}
    return [p for p in rec.parameters() if not isinstance(p, DTensor) and id(p) not in torchrecs]


def table_of(state_name: str, tables) -> str | None:
    """The planned table (its name) a state-dict entry of a sharded model holds, or None: a TorchRec model's
    entries carry the table's FQN (after KJTModel's prefix), a RecModel's the table's TorchRec key."""
    if not state_name.endswith(".weight") or "embedding_bags." not in state_name:
        return None
    path = state_name[:-len(".weight")]
    for name in (path.removeprefix(KJT_PREFIX) if path.startswith(KJT_PREFIX) else None,
                 path.split("embedding_bags.")[-1].replace("__", ".")):
        if name in tables:
            return name
    return None


def _data_type(dtype: torch.dtype):
    """TorchRec's DataType of a plain table's weights (the planner priced it at that width)."""
    from torchrec import DataType
    kinds = {torch.float32: DataType.FP32, torch.float16: DataType.FP16}
    if dtype not in kinds:
        raise PartitaError(f"an nn.EmbeddingBag of {dtype} runs through TorchRec as fp32 or fp16 only")
    return kinds[dtype]


@torch.no_grad()
def _copy_weights(dmp: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Each rank's pieces of every table from the full table (the same on every rank); `weights` by table name."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    copied = set()
    for name, value in dmp.state_dict().items():
        key = table_of(name, weights)
        if key is None:
            continue
        copied.add(key)
        full = weights[key]
        if isinstance(value, ShardedTensor):
            for s in value.local_shards():
                (r0, c0), (nr, nc) = s.metadata.shard_offsets, s.metadata.shard_sizes
                s.tensor.copy_(full[r0:r0 + nr, c0:c0 + nc])
        else:
            value.copy_(full)
    if missing := sorted(set(weights) - copied):
        raise PartitaError(f"table {missing[0]} is not in the sharded model's state under a name partita maps back "
                           "to it; its pieces cannot be set from the model's values (rename the table without '__')")
