"""Time from a node's death to the next step of an elastic run, phase by phase (issue 41).

Three local "nodes" (three `partita run SET --nnodes 2:3` commands, one CPU process each) train tiny-gpt from the
plan set `partita plan --cluster 3x1xcpu --global-batch 12 --nnodes 2:3` writes, checkpointing every step. Once
step FIRST is saved, one node that does not host the rendezvous store is SIGKILLed (launcher, agent and worker at
once), and the phases are timed from outside, polling /proc and the checkpoint directory every 20 ms:

- detection: the kill -> every worker of the two nodes left has exited (their collective failed, their agents
  saw it and stopped the attempt);
- rendezvous: -> the new round's workers exist (torch drops the dead node after 3 missed 1-s keep-alives; a
  round of fewer than MAX nodes closes runtime.launcher.elastic.LAST_CALL s after the last node came);
- resume to step: -> the first step after the resume is saved (the workers start and import, take the set's plan
  for 2 nodes, load the checkpoint resharded to it, train one step and save it).

Twice: from disk (a checkpoint after every step), and from the nodes' memory (`--snapshot-every 1`, a checkpoint
on disk only every 1000 steps: the state comes from the survivors' snapshots, runtime.checkpoint.recovery; the
step saved is then a snapshot). Both resume from the step before the one the kill landed in.

    python -m benchmarks.recovery [--repeats 3]   # writes benchmarks/results/recovery.json (~4 min)

On this machine's two shared cores with a model of a few MB, not on a cluster: what it shows is which phase
dominates, not a cluster's figures.
"""
from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from benchmarks.common import write

ROOT = Path(__file__).resolve().parents[1]
FIRST = 5
POLL = 0.02


def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            parents.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        kids = parents.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def _children(pid: int) -> list[int]:
    return [p for p in _descendants(pid) if _parent(p) == pid]


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _workers(node: subprocess.Popen) -> set[int]:
    """A node's training processes: its agent (the child of `partita run`) forks them, so they share its command
    line; the agent's other children (a resource tracker, the pre-flight) do not."""
    found = set()
    for agent in _children(node.pid):
        line = _cmdline(agent)
        found |= {p for p in _children(agent) if line and _cmdline(p) == line}
    return found


def _until(what, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := what():
            return value
        time.sleep(POLL)
    raise RuntimeError("the elastic run did not get there in time")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _steps(where: list[Path]) -> list[Path]:
    """The saved steps (checkpoints on disk, or the nodes' snapshots), oldest first."""
    found = [p for d in where if d.exists() for p in d.glob("step-*")]
    return sorted(found, key=lambda p: (int(p.name.split("-")[1]), p.stat().st_mtime if p.exists() else 0))


def _newest(where: list[Path]) -> int:
    found = _steps(where)
    return int(found[-1].name.split("-")[1]) if found else 0


def _since(where: list[Path], when: float) -> bool:
    """A step saved after `when` (wall clock): by the round after the death."""
    for p in _steps(where):
        try:
            if p.stat().st_mtime > when:
                return True
        except OSError:
            continue
    return False


def once(plan_set: Path, work: Path, memory: bool = False) -> dict:
    """One death and recovery, from disk or (`memory`) from the survivors' snapshots; the phases in seconds."""
    ck, port, job = work / "ck", _free_port(), f"recovery-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "PARTITA_SNAPSHOT_ROOT": str(work)}
    cmd = [sys.executable, "-m", "partita.cli", "run", str(plan_set), "--model", "tiny-gpt", "--steps", "100000",
           "--nnodes", "2:3", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", job, "--checkpoint-dir", str(ck),
           "--checkpoint-every", "1000" if memory else "1", "--keep", "3", "--log-every", "0",
           *(["--snapshot-every", "1"] if memory else [])]

    def where() -> list[Path]:
        return sorted(work.glob("partita-snapshots-*")) if memory else [ck]
    logs = [open(work / f"node{i}.log", "w") for i in range(3)]
    nodes = [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logs[0], stderr=subprocess.STDOUT)]
    try:
        _until(lambda: _listening(port))  # node 0 hosts the rendezvous store: it must live
        nodes += [subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=logs[i], stderr=subprocess.STDOUT) for i in (1, 2)]
        _until(lambda: _newest(where()) >= FIRST)
        old = _workers(nodes[0]) | _workers(nodes[1])
        doomed = [*_descendants(nodes[2].pid), nodes[2].pid]
        killed = time.monotonic()
        for pid in doomed:
            os.kill(pid, signal.SIGKILL)
        _until(lambda: not any(Path(f"/proc/{p}").exists() for p in old))
        detected = time.monotonic()
        _until(lambda: (_workers(nodes[0]) | _workers(nodes[1])) - old)
        rejoined, started = time.monotonic(), time.time()
        _until(lambda: _since(where(), started))
        stepped = time.monotonic()
    finally:
        for node in nodes[:2]:
            if node.poll() is None:
                node.send_signal(signal.SIGTERM)
        for node in nodes:
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                node.kill()
        for log in logs:
            log.close()
    said = "".join((work / f"node{i}.log").read_text() for i in range(2))
    if "lost before step" not in said or (memory and "from the nodes' memory" not in said):
        raise RuntimeError(f"the survivors did not say they resumed{' from memory' if memory else ''}: {said[-2000:]}")
    return {"detection_s": detected - killed, "rendezvous_s": rejoined - detected, "resume_to_step_s": stepped - rejoined,
            "total_s": stepped - killed}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    from partita.runtime.launcher.elastic import KEEP_ALIVE, KEEP_ALIVE_MISSES, LAST_CALL
    with tempfile.TemporaryDirectory() as tmp:
        plan_set = Path(tmp) / "set"
        subprocess.run([sys.executable, "-m", "partita.cli", "plan", "--model", "tiny-gpt", "--cluster", "3x1xcpu",
                        "--global-batch", "12", "--nnodes", "2:3", "--out", str(plan_set)], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
        runs = {"disk": [], "memory": []}
        for i in range(args.repeats):
            for kind in runs:
                work = Path(tmp) / f"{kind}{i}"
                work.mkdir()
                runs[kind].append(once(plan_set, work, memory=kind == "memory"))
                print(kind, ", ".join(f"{k} {v:.2f}" for k, v in runs[kind][-1].items()), flush=True)
    median = {kind: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for kind, rs in runs.items()}
    phases = {k: v for k, v in median["disk"].items() if k != "total_s"}
    payload = {"scenario": "3 local nodes of 1 CPU process, tiny-gpt, plan set 2:3 nodes, one node SIGKILLed after "
                           f"step {FIRST} is saved", "keep_alive_s": KEEP_ALIVE, "keep_alive_misses": KEEP_ALIVE_MISSES,
               "last_call_s": LAST_CALL, "runs": runs["disk"], "median": median["disk"],
               "dominant": max(phases, key=phases.get), "memory_runs": runs["memory"], "memory_median": median["memory"]}
    path = write("recovery", payload)
    for kind in runs:
        print(f"{kind} median: {', '.join(f'{k} {v:.2f} s' for k, v in median[kind].items())}")
    print(f"dominant: {payload['dominant']}; wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
