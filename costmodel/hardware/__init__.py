"""Devices, links and clusters.

Device peaks are the dense bf16/fp16 tensor-core figures of REFERENCE.md (vendor datasheets); fp32
peaks are the vendors' non-tensor-core FP32 figures. Achievable efficiency is a property of the device
preset (one place), not scattered through the search; `partita calibrate` replaces it with a measurement.

CLUSTER strings (DESIGN.md): "8xA100-80GB" (one node of 8), "128x8xA100-80GB" (nodes x devices per
node), "4xcpu" (local processes), islands of one of those joined by a slower link ("2x8x8xH100-80GB@2x100Gbps,20ms":
2 islands of 8 nodes of 8, 2 x 100 Gb/s and 20 ms between them; ISLANDS_FORMAT, `parse_islands`), or the path of a resource list (JSON/YAML, `partita.costmodel.hardware.resources`, as
written by `partita calibrate`), which may hold several groups of different devices.

A heterogeneous cluster keeps the homogeneous view the planner uses today, chosen to be conservative:
`device` is the field-wise worst device of all groups (`conservative_device`), `devices_per_node` the
greatest common divisor of the groups' devices per node (so a group of that many ranks is inside one
node of every group), `nodes` = total devices / devices_per_node, so `num_devices` is exact. The groups
themselves are in `cluster.groups`, each a homogeneous `Cluster`, for a planner that places stages on
different groups.
"""
from __future__ import annotations

import os

from partita.costmodel.hardware.device import (GB, GiB, DEFAULT_ALLOCATOR_HEADROOM, ALLOCATOR_CACHE_FACTOR,
                                               RECOMPUTE_CACHE_FACTOR, Device, GPU_OVERLAP_SLOWDOWN, KERNEL_FIELDS,
                                               UNALIGNED_FIELDS,
                                               FITTED_CONSTANTS, fitted_constants, kernel_constants, GPUS,
                                               gpu_device, DEVICES)
from partita.costmodel.hardware.cluster import (Cluster, device_on_stack, cluster_on_stack, FABRIC_FIELDS,
                                                with_fabric, conservative_device, cluster_from_groups,
                                                ISLANDS_FORMAT, get_device, GENERATION_PRESETS, gpu_preset,
                                                generation_preset, parse_cluster_string, parse_islands)

__all__ = ["GB", "GiB", "DEFAULT_ALLOCATOR_HEADROOM", "ALLOCATOR_CACHE_FACTOR", "RECOMPUTE_CACHE_FACTOR", "Device",
           "GPU_OVERLAP_SLOWDOWN", "KERNEL_FIELDS", "UNALIGNED_FIELDS", "FITTED_CONSTANTS", "fitted_constants", "kernel_constants",
           "GPUS", "gpu_device", "DEVICES", "Cluster", "device_on_stack", "cluster_on_stack", "FABRIC_FIELDS",
           "with_fabric", "conservative_device", "cluster_from_groups", "ISLANDS_FORMAT", "get_device",
           "GENERATION_PRESETS", "gpu_preset", "generation_preset", "parse_cluster", "parse_cluster_string",
           "parse_islands"]


def parse_cluster(spec: str) -> Cluster:
    """A CLUSTER string ('8xA100-80GB' -> 1 node of 8, '128x8xA100-80GB', '4xcpu', islands: cluster.py's
    parse_cluster_string), or the path of a resource list (an existing file, or a name ending .json/.yaml/.yml:
    `partita calibrate`'s, read by resources.load_resources) -> its Cluster. The choice lives here, in the
    package, because resources.py builds on cluster.py."""
    if _is_resource_file(spec):
        from partita.costmodel.hardware.resources import load_resources
        return load_resources(spec)
    return parse_cluster_string(spec)


def _is_resource_file(spec) -> bool:
    if isinstance(spec, os.PathLike):
        return True
    return os.path.isfile(spec) or spec.strip().lower().endswith((".json", ".yaml", ".yml"))
