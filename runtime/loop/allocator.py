"""The CUDA caching allocator's configuration for a run: expandable segments unless the user chose.

PyTorch's caching allocator carves fixed-size segments out of device memory and caches the blocks it frees
for reuse; a step whose allocation sizes change (activations of different shapes, the loss's logit-sized
temporaries) can leave free memory split between segments that no single request fits. On the first GPU
runs (GPU-MEASUREMENTS.md, H200) a plan predicted at 115.95 GiB failed to allocate 15.66 GiB while the
allocator held 12.55 GiB reserved but unallocated; with `expandable_segments:True` (segments that grow by
mapping more pages, so freed memory at their ends is reused for any size; PyTorch's "CUDA semantics"
notes, "Optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF") the same plan ran. So every rank sets
`PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` before CUDA is first used -- unless the user set
PYTORCH_CUDA_ALLOC_CONF or its newer name PYTORCH_ALLOC_CONF, which is then left as they set it -- and only
with CUDA. The allocator reads it once, when CUDA initialises: a process that used CUDA before the runtime
started keeps the configuration it started with. The planner's allocator headroom
(costmodel.hardware.Device.allocator_headroom) is priced for this setting.
"""
from __future__ import annotations

import os
from typing import MutableMapping

ENV = "PYTORCH_CUDA_ALLOC_CONF"
NAMES = ("PYTORCH_ALLOC_CONF", ENV)
"""The variables PyTorch reads the allocator's configuration from (the newer name first)."""
SETTING = "expandable_segments:True"


def allocator_env(environ: MutableMapping[str, str], cuda: bool) -> dict[str, str]:
    """What to add to `environ` for a run: {ENV: SETTING} on CUDA when no configuration is set, else {}."""
    if not cuda or any(name in environ for name in NAMES):
        return {}
    return {ENV: SETTING}


def configure_allocator(environ: MutableMapping[str, str] | None = None, cuda: bool | None = None) -> dict[str, str]:
    """Set the allocator's configuration in `environ` (default os.environ) as `allocator_env` says, for this
    process and the processes it starts; `cuda` defaults to torch.cuda.is_available() (which does not
    initialise the allocator). Returns what was set."""
    if cuda is None:
        import torch
        cuda = torch.cuda.is_available()
    environ = os.environ if environ is None else environ
    added = allocator_env(environ, cuda)
    environ.update(added)
    return added
