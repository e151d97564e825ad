"""Hand-written baselines for benchmarks.runtime_overhead: plain PyTorch DDP, FSDP2 and DTensor TP scripts."""
