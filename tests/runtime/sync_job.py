"""A rank of test_trainer_hooks.py's runs (tests/rank_pool.py runs it as __main__ on each of 2 ranks): it registers
two toy sync modes for the length of one `partita.runtime.train.main(ARGV)` run and takes them out again.

- "counted": a hook that does nothing to training and records, per step, when each of its points ran and
  whether the parameters had changed by then (so it is known to sit around the optimizer step);
- "diloco_probe": the DiLoCo hook (runtime.loop.sync.diloco.DiLoCo) with its options, recording each rank's parameter
  checksum after every optimizer step;
- "streaming_probe": the streaming DiLoCo hook (runtime.loop.sync.diloco.StreamingDiLoCo) with its options, recording each
  rank's parameter checksum per fragment after every optimizer step;
- "powersgd_probe": the PowerSGD hook (runtime.loop.sync.PowerSGD), recording after every optimizer step torch's
  PowerSGDState iteration count and how many buckets hold error feedback;
- "local_sgd" (option `every` = H): no gradient averaging in the backward (DDP's no_sync), each replica steps on its
  own gradients, and the parameters are averaged across the data-parallel replicas after every H-th optimizer
  step -- local SGD, the simplest of the modes that DiLoCo generalises.

Every rank writes its record to $SYNC_JOB_OUT.rank<r>.json.

    SYNC_JOB_OUT=OUT sync_job.py PLAN.json --model tiny-gpt --steps 4 ...
"""
import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist

from partita.planner.plan.sections import COUNT
from partita.planner.plan.sync import SYNC_MODES, SyncMode
from partita.runtime import train
from partita.runtime.loop import sync as runtime_sync

RECORD: list = []


def _checksum(params) -> float:
    with torch.no_grad():
        return float(sum(p.detach().double().sum() for p in params))


class Counted(runtime_sync.SyncHook):
    def during_backward(self, step):
        RECORD.append(["during_backward", step])
        return contextlib.nullcontext()

    def before_optimizer(self, step):
        self.before = _checksum(self.executor.params)
        RECORD.append(["before_optimizer", step, all(p.grad is not None for p in self.executor.params)])

    def after_optimizer(self, step):
        RECORD.append(["after_optimizer", step, _checksum(self.executor.params) != self.before])


class LocalSGD(runtime_sync.SyncHook):
    def during_backward(self, step):
        assert self.executor.ddp is not None, "the toy runs on a DDP plan"
        return self.executor.ddp.no_sync()  # each replica keeps its own gradients

    def after_optimizer(self, step):
        if step % self.options["every"]:
            return
        with torch.no_grad():
            for p in self.executor.params:
                dist.all_reduce(p.data, group=self.executor.replicas)
                p.data /= self.executor.n_replicas
        RECORD.append(["averaged", step])


class DiLoCoProbe(runtime_sync.DiLoCo):
    """The DiLoCo hook, recording after every optimizer step this rank's parameter checksum (after the outer step
    on the steps that take one)."""

    def after_optimizer(self, step):
        super().after_optimizer(step)
        RECORD.append(["params", step, _checksum(self.executor.params)])


class StreamingProbe(runtime_sync.StreamingDiLoCo):
    """The streaming DiLoCo hook, recording after every optimizer step this rank's checksum of each fragment."""

    def after_optimizer(self, step):
        super().after_optimizer(step)
        RECORD.append(["fragments", step, [_checksum([self.executor.params[i] for i in f]) for f in self.fragments]])


class PowerSGDProbe(runtime_sync.PowerSGD):
    def after_optimizer(self, step):
        RECORD.append(["powersgd", step, self.state.iter, len(self.state.error_dict)])


def _like(mode: str, name: str, summary: str) -> SyncMode:
    entry = SYNC_MODES[mode]
    return SyncMode(name=name, summary=summary, options=entry.options, defaults=entry.defaults, check=entry.check)


MODES = {"powersgd_probe": (_like("powersgd", "powersgd_probe", "powersgd, recording its state"), PowerSGDProbe),
         "streaming_probe": (_like("streaming", "streaming_probe", "streaming diloco, recording fragment checksums"),
                             StreamingProbe),
         "diloco_probe": (SyncMode(name="diloco_probe", summary="diloco, recording parameter checksums",
                                   options=SYNC_MODES["diloco"].options, defaults=SYNC_MODES["diloco"].defaults,
                                   check=SYNC_MODES["diloco"].check), DiLoCoProbe),
         "counted": (SyncMode(name="counted", summary="records its calls"), Counted),
         "local_sgd": (SyncMode(name="local_sgd", summary="average parameters every H steps",
                                options={"every": COUNT}), LocalSGD)}


def main(argv: list[str]) -> int:
    for name, (entry, hook) in MODES.items():
        SYNC_MODES[name], runtime_sync.HOOKS[name] = entry, hook
    try:
        code = train.main(argv)
        with open(f"{os.environ['SYNC_JOB_OUT']}.rank{os.environ['RANK']}.json", "w") as f:
            json.dump({"code": code, "record": RECORD}, f)
        return code
    finally:  # the pool's worker runs other jobs next: leave the registries as they were
        for name in MODES:
            SYNC_MODES.pop(name, None)
            runtime_sync.HOOKS.pop(name, None)
        RECORD.clear()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
