"""A pure-bf16 plan (TrainConfig.master_weights "none") runs as priced: the runtime builds the model in bf16,
steps AdamW on the bf16 parameters (bf16 moments, no fp32 master), and the model-state bytes each rank holds
(runtime.loop.memory.state_bytes, as the training loop measures them) are the plan's predicted model states
(costmodel.price.memory: 2 + 2 + 2 + 2 bytes per parameter) -- one 2-process gloo job, dp=2, ZeRO-0 and ZeRO-3."""
from __future__ import annotations

import math
import os

import numpy as np
import torch
import torch.distributed as dist

from spawned import gather_and_end, spawned_json

import partita
from partita import runtime
from partita.planner.enumerate.space import TrainConfig

MODEL = "tiny-gpt"
STEPS = 4
LR = 3e-3
"""On a token file of one repeating 8-token phrase (learnable in a few steps, unlike random tokens, whose loss
stays at ln(vocab)), at a rate that shows it in 4 steps."""


def _plan(zero: int) -> dict:
    plan = partita.plan(MODEL, cluster="2xcpu", train=TrainConfig(global_batch=4, dtype="bf16", master_weights="none"),
                        pp=1, dp=2, tp=1, zero=zero, recompute="none", offload=False)
    return plan.to_dict()


def _worker(rank: int, world: int, store_path: str, out: str) -> None:
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))  # runtime.launcher.mesh reads them
    dist.init_process_group("gloo", store=dist.FileStore(store_path, world), rank=rank, world_size=world)
    from partita.runtime.loop import memory
    plain = memory.state_bytes
    seen: dict = {}

    def measured(params, optimizer):  # what the loop measures, and what it measured it on
        params = list(params)
        seen["dtypes"] = sorted({str(p.dtype) for p in params}
                                | {str(v.dtype) for st in optimizer.state.values() for k, v in st.items()
                                   if isinstance(v, torch.Tensor) and k != "step"})
        seen["step_tensors"] = sum(isinstance(st.get("step"), torch.Tensor) for st in optimizer.state.values())
        seen["bytes"] = max(seen.get("bytes", 0), plain(params, optimizer))
        return plain(params, optimizer)
    memory.state_bytes = measured
    data = os.path.join(os.path.dirname(store_path), "phrase.npy")
    if rank == 0:
        np.save(data, np.tile(np.arange(8, dtype=np.uint16), 512))
    dist.barrier()
    rows = {}
    try:
        for zero in (0, 3):
            seen.clear()
            plan = _plan(zero)
            result = runtime.run(plan, MODEL, data, steps=STEPS, lr=LR, print_report=False)
            rows[f"zero{zero}"] = dict(seen, losses=result.losses, zero=plan["zero_stage"], train=plan["train"],
                                       predicted=plan["predicted"]["memory_per_stage"][0]["model_states"],
                                       parameters=plan["model"]["parameters"])
    finally:
        memory.state_bytes = plain
    gather_and_end(rows, out)


def test_a_pure_bf16_plan_trains_in_bf16_with_the_predicted_state_bytes():
    every = spawned_json(_worker, nprocs=2)
    for rank, rows in enumerate(every):
        for zero in (0, 3):
            r = rows[f"zero{zero}"]
            assert r["train"]["master_weights"] == "none" and r["zero"] == zero, r
            assert r["dtypes"] == ["torch.bfloat16"], r  # parameters and Adam moments: no fp32 copy anywhere
            assert all(math.isfinite(x) for x in r["losses"]) and r["losses"][-1] < r["losses"][0], r
            # AdamW also keeps a 4-byte fp32 step counter per parameter tensor, which no formula counts
            state = r["bytes"] - 4 * r["step_tensors"]
            if zero == 0:  # every rank holds all 134,912 parameters x 8 bytes: exactly the prediction
                assert r["parameters"] == 134_912 and r["predicted"] == 134_912 * 8 == 1_079_296, r
                assert state == r["predicted"], (rank, r)
            else:  # each rank its half of the sharded states, (2 + 2 + 2 + 2) x 134,912 / 2 (every tensor of
                # tiny-gpt splits evenly in two); the prediction adds the bf16 parameters FSDP gathers around them
                assert state == 134_912 * 8 // 2 == 539_648, (rank, r)
                assert r["predicted"] >= state, r
