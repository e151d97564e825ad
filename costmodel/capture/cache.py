"""Captures kept on disk: a second plan of the same model loads its OpGraph instead of tracing it again.

Planning tiny-gpt took ~8 s under load: importing torch ~3 s, torch._dynamo (which FakeTensorMode imports) ~3 s,
the trace ~1 s, the search ~0.1 s. A plan whose capture is cached reads it from a file and imports neither torch
nor anything of the trace (planner.api.plan_search): ~1 s for the whole `partita plan`.

What is cached: the OpGraph of `capture(spec, dtype, autocast=...)` with the model's name, config and fingerprint
(what the plan records), for a MODEL string that alone fixes the model -- a preset (`tiny-gpt`, `resnet50`), a
`gpt:` / `llama:` / `resnet:` string, or an `hf:` string (transformers' version is in the key). Never for an
nn.Module, a ModelSpec or a `package.module:factory` string: their code can change under the same name.

The key: the MODEL string, the sequence length asked for (None: the model's own), dtype, autocast lists, batch,
torch's, Python's and (for `hf:`) transformers' versions (torch's and transformers' as installed, read from their
package metadata: torch.__version__ without importing torch), and a digest of every .py file under costmodel/
-- any change to capture or pricing code misses. A hit must also repeat the whole key inside the file. The
plan reads the model's name, config and fingerprint from the file too: a warm plan builds no model at all.

Where: $PARTITA_CACHE_DIR/capture/, else $XDG_CACHE_HOME/partita/capture/, else ~/.cache/partita/capture/;
`PARTITA_CACHE_DIR=off` turns the cache off (neither read nor written). One JSON file per key -- tiny-gpt 30-40 KB,
llama3-8b 1.1 MB and gpt3-175b 1.5 MB in bf16, loaded in ~0.01 s and ~0.1 s -- written to a temporary file and
renamed into place, so a reader never sees half a file. A file not used for PRUNE_DAYS days is removed when
another is written; nothing else is pruned (`rm -r ~/.cache/partita` is always safe).

The file is data, never code: JSON whose values are decoded by type tags (tuples come back as tuples, so a
loaded graph equals a fresh capture); a file that does not decode, or does not match its key, is a miss and is
overwritten by the next capture -- never an error.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from partita.costmodel.capture.graph import OpGraph

ENV = "PARTITA_CACHE_DIR"
OFF = "off"
"""PARTITA_CACHE_DIR=off: no capture cache."""
FORMAT = 1
"""The file layout's version (in the key: a new layout misses the old files)."""
BATCH = 1
"""The batch the planner captures at (per-sample costs)."""
MAX_BYTES = 512 << 20
"""A larger file is not read (the largest presets' captures are under 2 MB)."""
PRUNE_DAYS = 30
FAMILIES = ("gpt:", "llama:", "resnet:", "hf:")
"""MODEL strings that fix the model by themselves (costmodel.models.registry.resolve_model resolves these before
any `package.module:factory` import)."""


@dataclass
class Hit:
    """A cached capture: the graph and what the plan records of the model."""

    graph: OpGraph
    name: str
    config: dict
    fingerprint: str


class _Undecodable(ValueError):
    """A value the cache cannot write or read back exactly."""


# where and whether -----------------------------------------------------------------------------------------------
def directory() -> Path | None:
    """The capture cache's folder, or None when PARTITA_CACHE_DIR=off (or there is no home folder)."""
    root = os.environ.get(ENV, "")
    if root.strip().lower() == OFF:
        return None
    if not root:
        xdg, home = os.environ.get("XDG_CACHE_HOME", ""), os.path.expanduser("~")
        if not xdg and home == "~":  # no home folder to be found: no cache rather than one in the working directory
            return None
        root = os.path.join(xdg, "partita") if xdg else os.path.join(home, ".cache", "partita")
    return Path(root) / "capture"


def cacheable(model) -> bool:
    """Whether `model` is a MODEL string that alone fixes the model (module docstring)."""
    if not isinstance(model, str):
        return False
    from partita.costmodel.models.configs import CNN_PRESETS, PRESETS
    return model in PRESETS or model in CNN_PRESETS or model.startswith(FAMILIES)


# the key -----------------------------------------------------------------------------------------------------------
def key(model, *, seq: int | None, dtype: str, autocast: str | None) -> dict | None:
    """The key of `model`'s capture (module docstring), or None when it is not cached."""
    if directory() is None or not cacheable(model):
        return None
    try:
        transformers = metadata.version("transformers") if model.startswith("hf:") else None
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None
    return {"format": FORMAT, "model": model, "seq": seq, "dtype": dtype, "autocast": autocast, "batch": BATCH,
            "torch": torch, "transformers": transformers, "python": sys.version, "costmodel": source_digest()}


def source_digest() -> str:
    """sha256 over the path and text of every .py file under costmodel/ (capture, models, pricing)."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def path_of(k: dict) -> Path:
    """The file of key `k`: a hash of the key names it."""
    name = hashlib.sha256(json.dumps(k, sort_keys=True).encode()).hexdigest()[:32]
    return directory() / f"{name}.json"


# load and store ------------------------------------------------------------------------------------------------------
def load(k: dict | None) -> Hit | None:
    """The capture stored under key `k`, or None (no key, no file, or a file that does not decode or match)."""
    if k is None:
        return None
    t0 = time.perf_counter()
    path = path_of(k)
    try:
        if path.stat().st_size > MAX_BYTES:
            return None
        entry = decode(path.read_bytes())
        if not isinstance(entry, dict) or entry.get("key") != k:
            return None
        hit = Hit(_graph_from(entry["graph"]), *_model_from(entry))
    except Exception:  # noqa: BLE001 -- unreadable, truncated or foreign: a miss, overwritten by the next capture
        return None
    hit.graph.capture_seconds = time.perf_counter() - t0  # this run's cost of the graph: the load
    _touch(path)
    return hit


def store(k: dict | None, graph: OpGraph, *, name: str, config: dict, fingerprint: str) -> Path | None:
    """Write the capture under key `k` (atomically); None when it is not cached or cannot be written."""
    if k is None:
        return None
    try:
        text = encode({"key": k, "name": name, "config": config, "fingerprint": fingerprint,
                       "graph": _graph_data(graph)})
    except _Undecodable:
        return None
    path = path_of(k)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_atomically(path, text)
    except OSError:
        return None
    _prune(path.parent, keep=path)
    return path


def _write_atomically(path: Path, text: str) -> None:
    """`text` into `path` by a temporary file in the same folder and a rename: readers see the old or the new file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _touch(path: Path) -> None:
    """Mark `path` used now (what _prune goes by)."""
    with contextlib.suppress(OSError):
        os.utime(path)


def _prune(folder: Path, keep: Path) -> None:
    """Remove the captures not used for PRUNE_DAYS days, and temporary files a killed writer left."""
    old = time.time() - PRUNE_DAYS * 86400
    for path in folder.glob("*.json"):
        with contextlib.suppress(OSError):
            if path != keep and path.stat().st_mtime < old:
                path.unlink()


# values as typed JSON ------------------------------------------------------------------------------------------------
_PLAIN = (type(None), bool, int, float, str)


def encode(value: Any) -> str:
    """`value` as JSON text that `decode` reads back into an equal value of the same types (module docstring)."""
    return json.dumps(_tagged(value), separators=(",", ":"))


def _tagged(value: Any) -> Any:
    """None, bool, int, float, str and lists as JSON has them; a tuple as {"t": [...]}, a dict as
    {"d": [[key, value], ...]} (keys of any type, in order): the only JSON objects are these tags. Any other type
    (a subclass too) raises _Undecodable."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is list:
        return [_tagged(v) for v in value]
    if kind is tuple:
        return {"t": [_tagged(v) for v in value]}
    if kind is dict:
        return {"d": [[_tagged(k), _tagged(v)] for k, v in value.items()]}
    raise _Undecodable(f"a {kind.__name__} is not cached")


def decode(text: str | bytes) -> Any:
    """The value `encode` wrote; an exception (ValueError, TypeError) for any other text."""
    return json.loads(text, object_hook=_untagged)


def _untagged(obj: dict) -> Any:
    """One JSON object of `_tagged`'s (its contents decoded already: json calls this innermost first)."""
    if len(obj) == 1:
        if type(obj.get("t")) is list:
            return tuple(obj["t"])
        if type(obj.get("d")) is list:
            return {k: v for k, v in obj["d"]}  # TypeError or ValueError for anything but hashable pairs
    raise _Undecodable("not a cached value")


# the graph ---------------------------------------------------------------------------------------------------------
FIELDS = {"name": (str,), "batch": (int,), "seq_len": (int, type(None)), "dtype": (str,), "groups": (list,),
          "layer_container": (str, type(None)), "layer_containers": (list,), "capture_seconds": (float, int)}
"""OpGraph's own attributes (but `g`), with the types a loaded one must have."""


def _graph_data(graph: OpGraph) -> dict:
    """The OpGraph as plain values: its fields, the networkx graph's attributes, the nodes in order, and the edges
    in an order that rebuilds each node's successors and predecessors in the order the capture made them."""
    extra = set(vars(graph)) - {*FIELDS, "g", "_by_group"}
    if extra:
        raise _Undecodable(f"OpGraph attributes {sorted(extra)}")
    g = graph.g
    return {"fields": {k: getattr(graph, k) for k in FIELDS}, "attrs": g.graph,
            "nodes": [[n, d] for n, d in g.nodes(data=True)],
            "edges": [[u, v, g.edges[u, v]] for u, v in _edge_order(g)]}


def _edge_order(g) -> list[tuple]:
    """The edges in an order that, added one by one, gives every node its successors and its predecessors in the
    order `g` holds them (networkx keeps each in insertion order; g.edges alone keeps only the successors')."""
    from graphlib import TopologicalSorter
    after: dict[tuple, set] = {e: set() for e in g.edges}
    for n in g.nodes:
        for chain in ([(n, m) for m in g.successors(n)], [(m, n) for m in g.predecessors(n)]):
            for a, b in zip(chain, chain[1:]):
                after[b].add(a)
    return list(TopologicalSorter(after).static_order())


def _graph_from(data: dict) -> OpGraph:
    """The OpGraph of `_graph_data`'s values; _Undecodable (or KeyError, TypeError, ValueError) for others."""
    fields = data["fields"]
    if set(fields) != set(FIELDS) or not all(isinstance(fields[k], t) for k, t in FIELDS.items()):
        raise _Undecodable("OpGraph fields")
    graph = OpGraph(name=fields["name"], batch=fields["batch"], seq_len=fields["seq_len"], dtype=fields["dtype"])
    for k, v in fields.items():
        setattr(graph, k, v)
    graph.g.graph.update(_attrs(data["attrs"]))
    for n, d in data["nodes"]:
        graph.g.add_node(n, **_attrs(d))
    for u, v, d in data["edges"]:
        if u not in graph.g or v not in graph.g:
            raise _Undecodable("an edge to no node")
        graph.g.add_edge(u, v, **_attrs(d))
    return graph


def _attrs(d) -> dict:
    if not isinstance(d, dict) or not all(isinstance(k, str) for k in d):
        raise _Undecodable("attributes")
    return d


def _model_from(entry: dict) -> tuple[str, dict, str]:
    name, config, fingerprint = entry["name"], entry["config"], entry["fingerprint"]
    if not (isinstance(name, str) and isinstance(config, dict) and isinstance(fingerprint, str)):
        raise _Undecodable("model")
    return name, config, fingerprint
