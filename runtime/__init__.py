"""Execution of a Plan with torch.distributed: mesh, tensor/pipeline/data parallelism, ZeRO 2/3 (FSDP2),
recompute, offload, bf16, train loop, verify.

Entry point: `python -m torch.distributed.run ... -m runtime.train PLAN.json --model MODEL --steps N`.
"""
