"""Nodes that agree: every rank checks, as the process group starts, that all ranks run the same job.

Each node of a multi-node run is started by its own command. Two nodes given `--lr 1e-3` and `--lr 1e-1` used
to train on, each its own way, while the gradient all-reduce silently averaged them; another plan file or
another `--steps` on one node made the ranks call different collectives (gloo aborts with pages of C++ frames).

`run_fields` is what must be equal on every rank: the plan's content (a digest of its canonical JSON, not its
path), the model string, the training flags, the data source (a token file by the digest of its content,
where this rank computed it -- one rank per node, runtime.data.TokenFile.content_digest -- and its length and
token type; a dataset by its factory name) and the checkpoint settings. runtime.train gathers every rank's
fields with its refusal, in one exchange of text right after the default process group starts and before any
collective whose shape depends on them (the mesh, the model build); `disagreement` names the first field in
which a rank differs from rank 0 in one line, and every rank ends with it (exit 2, before any step).
Output settings (--losses-out, --log-every, --tensorboard, --save-final) concern rank 0 alone and are not
compared.
"""
from __future__ import annotations

import hashlib
import json
import socket

from partita.runtime.launcher.flags import RECIPE_FLAGS

FLAGS = ("steps", "lr", "seed", "verify", "data_dtype", "sync_batchnorm", "checkpoint_every", "keep", "resume",
         "max_restarts", *RECIPE_FLAGS)
"""runtime.train flags (argparse names) that must be equal on every rank."""


def plan_digest(plan) -> str:
    """SHA-256 of the plan's canonical JSON (planner.plan.Plan.canonical_json: without the solver's wall times)."""
    return hashlib.sha256(plan.canonical_json().encode()).hexdigest()


def data_fields(describe: dict | None) -> dict:
    """What of a data source (runtime.data `describe()`) must agree: never a path, which may differ per node."""
    if not describe:
        return {}
    kind = describe.get("kind")
    if kind == "file":
        out = {"kind": kind, "tokens": describe.get("tokens"), "dtype": describe.get("dtype")}
        if describe.get("sha256"):
            out["sha256"] = describe["sha256"]
        return out
    if kind == "dataset":
        return {"kind": kind, "factory": describe.get("factory"), "samples": describe.get("samples")}
    return {"kind": kind}


def run_fields(args, plan=None, data: dict | None = None) -> dict:
    """This rank's fields (module docstring): `args` runtime.train's namespace, `plan` the loaded plan and `data`
    its data source's `describe()` -- None when the rank's checks stopped before them (its refusal says why):
    such a field is not compared."""
    fields = {"host": socket.gethostname(), "plan_path": str(args.plan), "model": args.model,
              "checkpoint_dir": bool(args.checkpoint_dir), "data": data_fields(data) if data is not None else None}
    fields.update({name: getattr(args, name) for name in FLAGS})
    if plan is not None:
        fields["plan"] = plan_digest(plan)
    return fields


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _differs(name: str, mine: dict, theirs: dict) -> str | None:
    """How rank `theirs` differs from rank 0 (`mine`) in field `name`, or None."""
    if name == "plan":
        if "plan" not in mine or "plan" not in theirs or mine["plan"] == theirs["plan"]:
            return None
        return "the plan", f"{theirs['plan_path']} (content sha256 {theirs['plan'][:12]})", \
            f"{mine['plan_path']} (content sha256 {mine['plan'][:12]})"
    if name == "data":
        a, b = mine["data"], theirs["data"]
        if a is None or b is None:
            return None
        keys = [k for k in ("kind", "factory", "samples", "tokens", "dtype", "sha256") if k in a or k in b]
        for k in keys:
            if k == "sha256" and (k not in a or k not in b):
                continue
            if a.get(k) != b.get(k):
                what = {"sha256": "content sha256", "tokens": "tokens", "dtype": "token type",
                        "kind": "source", "factory": "dataset", "samples": "samples"}[k]
                show = (lambda v: str(v)[:12]) if k == "sha256" else str
                return "the data (--data)", f"{what} {show(b.get(k))}", f"{what} {show(a.get(k))}"
        return None
    if mine.get(name) == theirs.get(name):
        return None
    if name == "model":
        return "--model", str(theirs[name]), str(mine[name])
    if name == "checkpoint_dir":
        said = {True: "a --checkpoint-dir", False: "no --checkpoint-dir"}
        return "--checkpoint-dir", said[theirs[name]], said[mine[name]]
    return _flag(name), f"{_flag(name)} {theirs.get(name)}", f"{_flag(name)} {mine.get(name)}"


ORDER = ("plan", "model", *FLAGS, "checkpoint_dir", "data")


def disagreement(every: list[dict | None]) -> tuple[int, str] | None:
    """(rank, line) for the first rank whose fields differ from rank 0's, or None when all agree. Ranks
    without fields (None) are passed over."""
    base = every[0]
    if base is None:
        return None
    for rank, theirs in enumerate(every[1:], start=1):
        if theirs is None:
            continue
        for name in ORDER:
            found = _differs(name, base, theirs)
            if found:
                what, theirs_text, mine_text = found
                return rank, (f"the nodes disagree on {what}: rank {rank} (host {theirs['host']}) runs with "
                              f"{theirs_text}, rank 0 (host {base['host']}) with {mine_text}: start every node with "
                              "the same command, plan and data")
    return None


def agree(refusal: str | None, fields: dict | None) -> tuple[int, str] | None:
    """Collective on the default group: (rank, line) of the first disagreement between the ranks' fields, else
    of the lowest rank's refusal, else None. Every rank returns the same."""
    from partita.runtime.launcher.mesh import gather_text
    said = [json.loads(t) for t in gather_text(json.dumps({"refusal": refusal, "fields": fields}))]
    found = disagreement([s["fields"] for s in said])
    if found:
        return found
    for rank, s in enumerate(said):
        if s["refusal"]:
            return rank, s["refusal"]
    return None
