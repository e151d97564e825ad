"""`partita export plan.json --to torchrec`: the plan's embedding section as TorchRec code.

It prints a Python snippet for people who launch TorchRec themselves: one ParameterShardingGenerator per
table (torchrec.distributed.sharding_plan: table_wise(rank), column_wise(ranks), row_wise(),
table_row_wise(host_index), data_parallel()) with the compute kernel of its placement (fused, fused_uvm,
fused_uvm_caching) and, for a cache, the cache load factor (the cached fraction of the table's rows,
TorchRec's CacheParams.load_factor), and the fused optimizer of the plan. A TorchRec model's tables keep their
EmbeddingBagConfig names and collection path; plain nn.EmbeddingBag tables are named by their module FQNs
with "." as "__" (runtime.rec.run names them so): rename them to your EmbeddingBagCollection's tables. The
planner only writes text here: TorchRec is not imported.
"""
from __future__ import annotations

from partita.costmodel.sparse.costs import TORCHREC_KERNELS
from partita.planner.plan import Plan, PlanError, one_line

_OPTIMIZERS = {"sgd": "EXACT_SGD", "rowwise_adagrad": "EXACT_ROWWISE_ADAGRAD", "adam": "ADAM"}


def _generator(t: dict, per_node: int) -> str:
    kernel = TORCHREC_KERNELS[t.get("placement", "hbm")]
    kind, ranks = t["sharding"], t["ranks"]
    if kind == "data_parallel":
        return "data_parallel()"
    if kind == "table_wise":
        return f'table_wise(rank={ranks[0]}, compute_kernel="{kernel}")'
    if kind == "column_wise":
        return f'column_wise(ranks={list(ranks)}, compute_kernel="{kernel}")'
    if kind == "row_wise":
        return f'row_wise(compute_kernel="{kernel}")'
    return f"table_row_wise(host_index={ranks[0] // per_node})"


def _comment(text) -> str:
    """A plan's free text as one line of a Python comment (a newline in it must not start code)."""
    return one_line(" ".join(str(text).split()))


def _seconds(x) -> str:
    return f"{x:.4g} s" if isinstance(x, (int, float)) and not isinstance(x, bool) else "(none)"


def _key(t: dict) -> str:
    """The table's name in TorchRec: its EmbeddingBagConfig's for a collection's table, else the FQN with "__"."""
    return t.get("key") or t["name"].replace(".", "__")


def to_torchrec(plan: Plan) -> str:
    e = plan.embeddings
    if not e:
        raise PlanError("--to torchrec exports a plan's embedding tables; this plan has none (plan a model with "
                        "nn.EmbeddingBag tables, e.g. dlrm-criteo-1tb)")
    world = plan.mesh.world_size
    per_node = plan.cluster.get("devices_per_node") or world
    if not isinstance(per_node, int) or isinstance(per_node, bool) or per_node < 1:
        raise PlanError(f"cluster.devices_per_node must be a positive integer, not {per_node!r}")
    collections = sorted({t.get("collection", "") for t in e["tables"]})
    if len(collections) > 1:
        raise PlanError(f"--to torchrec writes one EmbeddingBagCollection's plan; this plan's tables are in "
                        f"{len(collections)} ({', '.join(c or '(plain nn.EmbeddingBag tables)' for c in collections)})")
    module_path = collections[0] or "ebc"
    ebc = f"model.get_submodule({module_path!r})" if collections[0] else "model.ebc"
    lines = [
        f"# partita plan for {_comment(plan.model.get('name'))} on {_comment(plan.cluster.get('spec'))} ({world} "
        f"ranks): {len(e['tables'])} tables, predicted step {_seconds(plan.predicted.get('step_time_s'))}",
        "# partita: the dense part is data-parallel (DistributedModelParallel wraps it in DDP)" if plan.zero_stage != 3
        else "# partita: the dense part is sharded (FSDP2, ZeRO-3): pass init_data_parallel=False to "
             "DistributedModelParallel and fully_shard the modules that hold no collection",
        "from fbgemm_gpu.split_embedding_configs import EmbOptimType",
        "from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder",
        "from torchrec.distributed.sharding_plan import (column_wise, construct_module_sharding_plan, data_parallel,",
        "                                                row_wise, table_row_wise, table_wise)",
        "from torchrec.distributed.types import CacheParams, ShardingPlan",
        "",
        "PER_TABLE = {",
    ]
    for t in e["tables"]:
        lines.append(f'    {_key(t)!r}: {_generator(t, per_node)},')
    lines += [
        "}",
        f"KERNELS = {{{', '.join(repr(_key(t)) + ': ' + repr(TORCHREC_KERNELS[t.get('placement', 'hbm')]) for t in e['tables'] if t['sharding'] != 'data_parallel')}}}",
        f"CACHE_LOAD_FACTOR = {{{', '.join(repr(_key(t)) + ': ' + format(t['cache_fraction'], 'g') for t in e['tables'] if t.get('placement') == 'cache')}}}",
        f'FUSED_PARAMS = {{"optimizer": EmbOptimType.{_OPTIMIZERS[e.get("optimizer", "rowwise_adagrad")]}, '
        '"learning_rate": 0.01}  # your learning rate',
        "",
        "",
        f"def sharding_plan(ebc, module_path: str = {module_path!r}) -> ShardingPlan:",
        f"    module_plan = construct_module_sharding_plan(ebc, PER_TABLE, local_size={per_node}, world_size={world},",
        "                                                 device_type=\"cuda\")",
        "    for name, kernel in KERNELS.items():  # table_row_wise() takes none",
        "        module_plan[name].compute_kernel = kernel",
        "    for name, factor in CACHE_LOAD_FACTOR.items():",
        "        module_plan[name].cache_params = CacheParams(load_factor=factor)",
        "    return ShardingPlan({module_path: module_plan})",
        "",
        f"# DistributedModelParallel(model, plan=sharding_plan({ebc}),",
        "#                         sharders=[EmbeddingBagCollectionSharder(fused_params=FUSED_PARAMS)])",
    ]
    return "\n".join(lines) + "\n"
