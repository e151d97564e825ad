"""`--profile-out FILE`: where the last step's time went, operator by operator, as torch.profiler measured it.

The cost model prices each operator of the captured graph (costmodel.price.kernels); a run's step time is one
number. This times the operators of one real step, so a step the plan mispriced says which operators took the
difference (a GPT block's memory-bound operators, say, rather than its GEMMs). The run's last step runs under
`torch.profiler.profile` (CPU activity, and CUDA's where the run is on a GPU: each kernel's time on the device,
charged to the operator that launched it). Rank 0 writes FILE as JSON:

    {"step": N, "rank": 0, "device": "cuda" | "cpu", "step_time_s": the profiled step's wall time,
     "time": "device" | "cpu",            # which time `ops` are sorted by and summed in total_s
     "total_s": the sum of every operator's self time of that kind,
     "ops": [{"name": "aten::mm", "shapes": [[65536, 1024], [1024, 4096]], "calls": 48,
              "self_device_s": ..., "self_cpu_s": ...}, ...]}   # one row per operator and input shapes, largest first

Self times do not double count: an operator's self time leaves out the operators it calls. On a GPU the device
times are the kernels' own (CUPTI); the profiled step's wall time carries the profiler's per-operator overhead on
the host, so compare step times of unprofiled steps (benchmarks.gpu leaves that step out of its mean). Rank 0 only:
under a pipeline that is stage 0's operators.
"""
from __future__ import annotations

import json

import torch

from partita.runtime.loop.trainer import StepHook

TOP_OPS = 400
"""Operators kept in the file, largest self time first, each with the shapes of its inputs (a transformer step has
40-80 distinct operators, 100-300 with their shapes: its LM head's products apart from its layers')."""


class ProfileHook(StepHook):
    """Profiles step `step` (the run's last) and writes rank 0's operator table to `path` (module docstring)."""

    def __init__(self, path: str, step: int, rank: int, device: torch.device):
        self.path, self.step, self.rank, self.device = path, step, rank, device
        self._prof = None

    def during_backward(self, step: int):
        if step == self.step and self._prof is None:
            from torch.profiler import ProfilerActivity, profile
            cuda = self.device.type == "cuda"
            self._prof = profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])],
                                 record_shapes=True)
            self._prof.__enter__()
        return super().during_backward(step)

    def after_step(self, step: int, loss: float, seconds: float) -> None:
        if step != self.step or self._prof is None:
            return
        self._prof.__exit__(None, None, None)
        if self.rank == 0:
            table = operator_table(self._prof.key_averages(group_by_input_shape=True), self.device.type == "cuda")
            with open(self.path, "w") as f:
                json.dump({"step": step, "rank": self.rank, "device": self.device.type, "step_time_s": seconds,
                           **table}, f, indent=1)


def operator_table(averages, on_device: bool) -> dict:
    """{time, total_s, ops} of a profiler's key_averages(): each operator's calls and self times in seconds,
    sorted by the self time that measures the step (the device's on a GPU, the host's on a CPU)."""
    ops = []
    for e in averages:
        if not str(getattr(e, "device_type", "CPU")).endswith("CPU"):
            continue  # a kernel's own row: its time is already its launching operator's self device time
        device = getattr(e, "self_device_time_total", None)
        if device is None:
            device = getattr(e, "self_cuda_time_total", 0.0)  # (the name before torch 2.4)
        ops.append({"name": e.key, "shapes": [list(x) for x in getattr(e, "input_shapes", None) or []],
                    "calls": int(e.count), "self_device_s": device / 1e6, "self_cpu_s": e.self_cpu_time_total / 1e6})
    key = "self_device_s" if on_device else "self_cpu_s"
    ops = [o for o in ops if o[key] > 0]
    ops.sort(key=lambda o: -o[key])
    return {"time": "device" if on_device else "cpu", "total_s": sum(o[key] for o in ops), "ops": ops[:TOP_OPS]}


def profile_hooks(path: str | None, steps: int, topo) -> list[StepHook]:
    """The hook of --profile-out, or none."""
    return [ProfileHook(path, steps, topo.rank, torch.device(topo.device))] if path else []
