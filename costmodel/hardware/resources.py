"""Resource lists: a cluster described in a JSON or YAML file (DESIGN.md CLUSTER; written by calibrate).

Schema `partita.cluster/1` (units: bytes, bytes/s, FLOP/s, seconds):

    {
      "schema": "partita.cluster/1",
      "name": "lab",                              optional, a label
      "groups": [                                 one or more homogeneous groups
        {"name": "a100",                          unique
         "nodes": 2,                              integer >= 1
         "devices_per_node": 8,                   integer >= 1
         "device": "A100-80GB"},                  a preset name (costmodel.hardware.DEVICES), or:
        {"name": "box", "nodes": 1, "devices_per_node": 2,
         "device": {
           "name": "cpu",                         required
           "base": "cpu",                         optional preset whose figures fill the fields left out
           "peak_flops": {"bf16": 5e10, "fp32": 1e11},   dense peak FLOP/s by dtype
           "memory_bytes": 4e9, "mem_bandwidth": 1e10,
           "intra_node_bw": 1e9,                  bytes/s one device sends to its node peers
           "inter_node_bw": 1e8,                  bytes/s one device sends off-node (its NIC share)
           "intra_node_latency": 5e-4, "inter_node_latency": 1e-3,
           "matmul_efficiency": 0.5,              fraction of peak large matmuls reach, in (0, 1]
           "gemm_half_dim": 96,                   GEMM size halving that (costmodel.price.kernels); 0: none
           "gemm_unaligned_read_efficiency": 0.2, a Linear GEMM's rate kept reading rows of no multiple of
           "gemm_unaligned_write_efficiency": 0.15, 16 bytes / writing them, in (0, 1]; 1: priced as aligned
           "attention_efficiency": 0.5,           fused attention's fraction of peak; 0: matmul's
           "attention_half_seq": 1536,            sequence length halving that (costmodel.price.kernels); 0: none
           "mem_efficiency": 0.8,                 achieved fraction of mem_bandwidth, in (0, 1]
           "intra_link_efficiency": 0.8,          achieved fraction of intra_node_bw, in (0, 1]
           "inter_link_efficiency": 0.85,         achieved fraction of inter_node_bw, in (0, 1]
           "overlap_slowdown": 0.15,              compute stretch while collectives overlap it
           "host_bw": 1e10,                       device <-> host bytes/s (offload)
           "reserved_bytes": 2.5e8,               memory outside the allocator (CUDA context, NCCL)
           "allocator_headroom": 0.05,            fraction of the rest kept free for the allocator, in [0, 1);
                                                  null: the allocator's predicted cache (the GPU presets)
           "op_latency": 6e-6,                    seconds per operator launch
           "sync_latency": 8e-4,                  in-step seconds per collective message step
           "sharded_op_latency": 1e-4,            DTensor dispatch seconds per launch
           "sharded_param_latency": 6e-5,         DTensor seconds per parameter per optimizer step
           "redistribute_latency": 1.5e-4}}       DTensor seconds per tensor-parallel collective
      ],
      "inter_group_bw": 1.25e10,                  optional: bytes/s per device between groups
      "inter_group_latency": 2e-5,                optional: seconds
      "nodes_per_pod": 32,                        optional: nodes under one full-bandwidth pod
      "pod_oversubscription": 2.0,                optional (with nodes_per_pod): uplink oversubscription, >= 1
      "islands": {"bandwidth": 2.5e10,            optional: islands joined by a slower link (Cluster.islands):
                  "latency": 0.02,                bytes/s one island sends to the others per direction, all its
                  "count": 2},                    devices together; seconds per message; count (optional): the
                                                  one group split into this many equal islands of whole nodes.
                                                  Without count, every group is an island (all of equal size);
                                                  the string form is costmodel.hardware.ISLANDS_FORMAT
      "kernels": [{"kind": "gemm", ...}, ...],    optional: kernel timings of this device (calibrate on a GPU:
                                                  costmodel.calibrate.kernels' rows), for the kernel-constant fit
      "measurements": {...}                       optional, free-form: calibrate's raw data (not read)
    }

Without `base`, a device object needs name, peak_flops, memory_bytes, mem_bandwidth, intra_node_bw and
inter_node_bw; the other fields default as in `partita.costmodel.hardware.Device` (lists written before a field
existed load with its default: 0 for the CPU-side overheads sync_latency, sharded_op_latency,
sharded_param_latency and redistribute_latency). Unknown keys are errors (a
typo must not silently fall back to a default). Loading never executes code (json, yaml.safe_load).

`load_resources(path)` returns a `Cluster` whose `groups` are the groups and whose homogeneous view is
conservative (costmodel.hardware module docstring); `save_resources(cluster, path)` writes one back.
"""
from __future__ import annotations

import json
import math
import os
import re
from dataclasses import asdict, fields, replace

from partita.costmodel.errors import PartitaError
from partita.costmodel.hardware import DEVICES, UNALIGNED_FIELDS, Cluster, Device, cluster_from_groups, with_fabric

SCHEMA = "partita.cluster/1"
_TOP_KEYS = {"schema", "name", "groups", "inter_group_bw", "inter_group_latency", "nodes_per_pod",
             "pod_oversubscription", "kernels", "measurements", "islands"}
_ISLAND_KEYS = {"bandwidth", "latency", "count"}
_GROUP_KEYS = {"name", "nodes", "devices_per_node", "device"}
_DEVICE_FIELDS = {f.name for f in fields(Device)}
_DEVICE_KEYS = _DEVICE_FIELDS | {"base"}
_DEVICE_REQUIRED = ("name", "peak_flops", "memory_bytes", "mem_bandwidth", "intra_node_bw", "inter_node_bw")
_NONNEGATIVE = {"gemm_half_dim", "gemm_half_mn", "gemm_split_k", "attention_bwd_efficiency", "attention_half_dim",
                "attention_causal_block", "attention_efficiency", "attention_half_seq", "overlap_slowdown", "op_latency", "host_memory_bytes", "intra_node_latency", "inter_node_latency", "reserved_bytes", "allocator_headroom",
                "sync_latency", "sharded_op_latency", "sharded_param_latency", "redistribute_latency"}
_YAML_SUFFIXES = (".yaml", ".yml")


def _fail(where: str, msg: str):
    raise PartitaError(f"resource list: {where}: {msg}")


_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
"""A number written in decimal or scientific notation. PyYAML (YAML 1.1) reads 1e9 and 1.0e9 as strings --
only 1.0e+9 is a float there --, so such a string is taken as the number it spells."""


def _number(where: str, value, *, positive: bool = True) -> float:
    if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(where, f"must be a number, got {value!r}")
    if positive and value <= 0:
        _fail(where, f"must be > 0, got {value!r}")
    if not positive and value < 0:
        _fail(where, f"must be >= 0, got {value!r}")
    return float(value)


def _integer(where: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        _fail(where, f"must be an integer >= 1, got {value!r}")
    return value


def _unknown(where: str, d: dict, accepted) -> None:
    extra = sorted(set(d) - set(accepted))
    if extra:
        _fail(where, f"unknown key(s) {', '.join(map(repr, extra))}; accepted: {', '.join(sorted(accepted))}")


def _device(where: str, spec) -> Device:
    if isinstance(spec, str):
        if spec not in DEVICES:
            _fail(f"{where}.device", f"unknown device preset {spec!r}; presets: {', '.join(DEVICES)}, "
                                     f"or an object with the fields {', '.join(_DEVICE_REQUIRED)}")
        return DEVICES[spec]
    if not isinstance(spec, dict):
        _fail(f"{where}.device", f"must be a preset name or an object, got {spec!r}")
    where = f"{where}.device"
    _unknown(where, spec, _DEVICE_KEYS)
    base = {}
    if "base" in spec:
        if spec["base"] not in DEVICES:
            _fail(f"{where}.base", f"unknown device preset {spec['base']!r}; presets: {', '.join(DEVICES)}")
        base = asdict(DEVICES[spec["base"]])
    missing = [k for k in _DEVICE_REQUIRED if k not in spec and k not in base]
    if missing:
        _fail(where, f"missing {', '.join(missing)} (give them, or a 'base' preset to start from)")
    kw = {**base, **{k: v for k, v in spec.items() if k != "base"}}
    if not isinstance(kw["name"], str) or not kw["name"]:
        _fail(f"{where}.name", f"must be a non-empty string, got {kw['name']!r}")
    peaks = kw["peak_flops"]
    if not isinstance(peaks, dict) or set(peaks) != {"bf16", "fp32"}:
        _fail(f"{where}.peak_flops", f"must be an object with exactly the keys bf16 and fp32, got {peaks!r}")
    kw["peak_flops"] = {k: _number(f"{where}.peak_flops.{k}", v) for k, v in peaks.items()}
    for k in ("stack", "generation"):
        if k in kw and not isinstance(kw[k], str):
            _fail(f"{where}.{k}", f"must be a string, got {kw[k]!r}")
    if "stack" in kw:
        from partita.costmodel.hardware.stacks import STACKS
        if kw["stack"] not in STACKS:
            _fail(f"{where}.stack", f"unknown software stack {kw['stack']!r}; stacks: {', '.join(STACKS)}")
    if kw.get("other_attention") is not None:
        kw["other_attention"] = _attention_curves(f"{where}.other_attention", kw["other_attention"])
    for k in _DEVICE_FIELDS - {"name", "peak_flops", "stack", "generation", "other_attention"}:
        if k == "allocator_headroom" and kw.get(k) is None:  # null: the predicted cache (Device.allocator_headroom)
            kw.pop(k, None)
            continue
        if k in kw:
            kw[k] = _number(f"{where}.{k}", kw[k], positive=k not in _NONNEGATIVE)
    for k in ("matmul_efficiency", "mem_efficiency", "intra_link_efficiency", "inter_link_efficiency", "step_efficiency",
              *UNALIGNED_FIELDS):
        if not kw.get(k, 0.5) <= 1:
            _fail(f"{where}.{k}", f"must be in (0, 1], got {kw[k]!r}")
    for k in ("attention_efficiency", "attention_bwd_efficiency"):
        if not 0 <= kw.get(k, 0) <= 1:
            _fail(f"{where}.{k}", f"must be in [0, 1] (0: the default, costmodel.hardware.Device), got {kw[k]!r}")
    if not 0 <= kw.get("allocator_headroom", 0) < 1:
        _fail(f"{where}.allocator_headroom", f"must be a fraction in [0, 1), got {kw['allocator_headroom']!r}")
    if kw.get("reserved_bytes", 0) >= kw["memory_bytes"]:
        _fail(f"{where}.reserved_bytes", f"must be less than memory_bytes ({kw['memory_bytes']:g}), "
                                         f"got {kw['reserved_bytes']:g}")
    return Device(**kw)


def _attention_curves(where: str, curves) -> dict:
    """{kernel: {efficiency, bwd_efficiency, half_seq, half_dim, causal_block}} (costmodel.price.kernels)."""
    from partita.costmodel.price.kernels import ATTENTION_CURVE_FIELDS
    if not isinstance(curves, dict):
        _fail(where, f"must be an object of attention kernels, got {curves!r}")
    out = {}
    for kernel, curve in curves.items():
        if not isinstance(curve, dict) or set(curve) != set(ATTENTION_CURVE_FIELDS):
            _fail(f"{where}.{kernel}", f"must be an object with exactly the keys {', '.join(ATTENTION_CURVE_FIELDS)}")
        out[kernel] = {k: _number(f"{where}.{kernel}.{k}", v, positive=k in ("efficiency", "bwd_efficiency"))
                       for k, v in curve.items()}
    return out


def _check_kernels(rows) -> None:
    """`kernels` is a list of rows, each an object whose "kind" names the kernel (the fit reads the rest)."""
    if not isinstance(rows, list):
        _fail("kernels", f"must be a list of kernel rows, got {type(rows).__name__}")
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or not isinstance(row.get("kind"), str):
            _fail(f"kernels[{i}]", f"must be an object with a 'kind' (gemm, sdpa), got {row!r}")


def cluster_from_dict(d, spec: str = "") -> Cluster:
    """Validate a resource list (already parsed) and build its Cluster."""
    if not isinstance(d, dict):
        _fail("top level", f"must be an object with 'schema' and 'groups', got {type(d).__name__}")
    _unknown("top level", d, _TOP_KEYS)
    if d.get("schema") != SCHEMA:
        _fail("schema", f"must be {SCHEMA!r}, got {d.get('schema')!r}")
    if "kernels" in d:
        _check_kernels(d["kernels"])
    groups = d.get("groups")
    if not isinstance(groups, list) or not groups:
        _fail("groups", f"must be a non-empty list of groups, got {groups!r}")
    out, names = [], set()
    for i, g in enumerate(groups):
        where = f"groups[{i}]"
        if not isinstance(g, dict):
            _fail(where, f"must be an object with {', '.join(sorted(_GROUP_KEYS))}, got {g!r}")
        _unknown(where, g, _GROUP_KEYS)
        missing = [k for k in ("name", "nodes", "devices_per_node", "device") if k not in g]
        if missing:
            _fail(where, f"missing {', '.join(missing)}")
        name = g["name"]
        if not isinstance(name, str) or not name:
            _fail(f"{where}.name", f"must be a non-empty string, got {name!r}")
        if name in names:
            _fail(f"{where}.name", f"duplicate group name {name!r}")
        names.add(name)
        where = f"groups[{i}] ({name})"
        out.append(Cluster(nodes=_integer(f"{where}.nodes", g["nodes"]),
                           devices_per_node=_integer(f"{where}.devices_per_node", g["devices_per_node"]),
                           device=_device(where, g["device"]), spec=name))
    inter_bw = d.get("inter_group_bw")
    inter_lat = d.get("inter_group_latency")
    pods = {}
    if "nodes_per_pod" in d:
        pods["nodes_per_pod"] = _integer("nodes_per_pod", d["nodes_per_pod"])
        ratio = _number("pod_oversubscription", d.get("pod_oversubscription", 1.0))
        if ratio < 1:
            _fail("pod_oversubscription", f"must be >= 1 (node-facing over uplink bandwidth), got {ratio!r}")
        pods["pod_oversubscription"] = ratio
    elif "pod_oversubscription" in d:
        _fail("pod_oversubscription", "needs nodes_per_pod (how many nodes one pod holds)")
    out = [replace(g, **pods) for g in out]
    cluster = replace(cluster_from_groups(
        out, spec=spec,
        inter_group_bw=None if inter_bw is None else _number("inter_group_bw", inter_bw),
        inter_group_latency=None if inter_lat is None else _number("inter_group_latency", inter_lat,
                                                                    positive=False)), **pods)
    return replace(cluster, **_islands(d["islands"], out)) if "islands" in d else cluster


def _islands(spec, groups: list[Cluster]) -> dict:
    """The Cluster island fields of a resource list's `islands` object (module docstring); one line if they do
    not add up."""
    if not isinstance(spec, dict):
        _fail("islands", f"must be an object with bandwidth, latency and optionally count, got {spec!r}")
    _unknown("islands", spec, _ISLAND_KEYS)
    if "bandwidth" not in spec:
        _fail("islands", "missing bandwidth (bytes/s one island sends to the others, per direction)")
    bw = _number("islands.bandwidth", spec["bandwidth"])
    latency = _number("islands.latency", spec.get("latency", 0.0), positive=False)
    if "count" in spec:
        count = _integer("islands.count", spec["count"])
        if len(groups) != 1 or count < 2 or groups[0].nodes % count:
            _fail("islands.count", f"{count} islands must split one group's nodes evenly (2 or more); the list has "
                                   f"{len(groups)} group(s) of {', '.join(str(g.nodes) for g in groups)} node(s)")
    else:
        count, sizes = len(groups), {g.num_devices for g in groups}
        if count < 2 or len(sizes) > 1:
            _fail("islands", f"every group is an island: needs 2 or more groups of equal size, got "
                             f"{', '.join(f'{g.spec} ({g.num_devices})' for g in groups)}; or give count")
    return {"islands": count, "island_bw": bw, "island_latency": latency}


def _read(path: str):
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        raise PartitaError(f"cluster file {path!r} not found; give an existing resource list "
                           f"(written by `partita calibrate`) or a cluster string such as 8xA100-80GB") from None
    except OSError as e:
        raise PartitaError(f"cannot read cluster file {path!r}: {e.strerror}") from None
    if path.lower().endswith(_YAML_SUFFIXES):
        yaml = _yaml()
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise PartitaError(f"cluster file {path!r} is not valid YAML: {e}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PartitaError(f"cluster file {path!r} is not valid JSON: {e}") from None


def _yaml():
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml is a dependency
        raise PartitaError("YAML resource lists need pyyaml (pip install pyyaml); or write JSON") from None
    return yaml


def load_resources(path) -> Cluster:
    """The Cluster a resource list file describes (JSON, or YAML by suffix)."""
    path = os.fspath(path)
    return cluster_from_dict(_read(path), spec=path)


def _device_dict(device: Device):
    if DEVICES.get(device.name) == device:
        return device.name
    return asdict(device)


def cluster_to_dict(cluster: Cluster, name: str | None = None, measurements: dict | None = None,
                    kernels: list[dict] | None = None) -> dict:
    """The resource list of a Cluster (its groups, or the cluster as one group), with measured `kernels` rows."""
    groups = cluster.group_list()
    d = {"schema": SCHEMA}
    if name:
        d["name"] = name
    d["groups"] = [{"name": g.spec or f"group{i}", "nodes": g.nodes, "devices_per_node": g.devices_per_node,
                    "device": _device_dict(g.device)} for i, g in enumerate(groups)]
    if cluster.inter_group_bw is not None:
        d["inter_group_bw"] = cluster.inter_group_bw
    if cluster.inter_group_latency is not None:
        d["inter_group_latency"] = cluster.inter_group_latency
    if cluster.nodes_per_pod:
        d["nodes_per_pod"], d["pod_oversubscription"] = cluster.nodes_per_pod, cluster.pod_oversubscription
    if cluster.islands > 1:
        d["islands"] = {"bandwidth": cluster.island_bw, "latency": cluster.island_latency,
                        **({"count": cluster.islands} if len(groups) != cluster.islands else {})}
    if kernels is not None:
        d["kernels"] = kernels
    if measurements is not None:
        d["measurements"] = measurements
    return d


def write_resources(d: dict, path) -> None:
    """Write a resource list dict as JSON, or YAML when the path ends .yaml/.yml. Validates first."""
    path = os.fspath(path)
    cluster_from_dict(d)
    text = json.dumps(d, indent=2) + "\n"
    if path.lower().endswith(_YAML_SUFFIXES):  # through JSON: plain types only (str subclasses ...)
        text = _yaml().safe_dump(json.loads(text), sort_keys=False)
    with open(path, "w") as f:
        f.write(text)


def save_resources(cluster: Cluster, path, name: str | None = None, measurements: dict | None = None) -> dict:
    d = cluster_to_dict(cluster, name=name, measurements=measurements)
    write_resources(d, path)
    return d


def with_allocator_headroom(cluster: Cluster, headroom: float | None) -> Cluster:
    """`cluster` with every device's allocator headroom set to `headroom` (a fraction in [0, 1) of the
    memory after the reserve: costmodel.hardware.Device.allocator_headroom); None leaves it as it is.
    `partita plan --memory-headroom` and `partita.plan(memory_headroom=...)`."""
    if headroom is None:
        return cluster
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or not 0 <= headroom < 1:
        raise PartitaError(f"memory headroom must be a fraction of device memory in [0, 1), e.g. 0.05 for 5%; "
                           f"got {headroom!r}")
    if not cluster.groups:
        return replace(cluster, device=replace(cluster.device, allocator_headroom=float(headroom)))
    groups = [with_allocator_headroom(g, headroom) for g in cluster.groups]
    out = cluster_from_groups(groups, inter_group_bw=cluster.inter_group_bw,
                              inter_group_latency=cluster.inter_group_latency, spec=cluster.spec)
    return with_fabric(out, cluster)
