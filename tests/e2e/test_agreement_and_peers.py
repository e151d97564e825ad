"""Nodes that agree, and nodes that notice a lost peer (issue 47 items 3, 5 and 9).

- The run agreement check (runtime.launcher.agreement): ranks started with another --lr, --steps, plan content or data
  content stop before any step, every rank with one line naming the rank, its host and the field; the same
  plan and data under other paths agree. On the session's long-lived ranks (tests/rank_pool.py), each rank a
  "node" of its own (LOCAL_RANK 0) with its own command line; then once through two real `partita run` nodes
  with other --steps, which gloo used to end in SIGABRT and pages of C++ frames.
- A lost node (runtime.launcher.peers, runtime.api): two `partita run` nodes train; one is killed outright (its launcher,
  its agent and its workers at once) and the other names it and stops, exit 1; or only its `partita run` is
  SIGKILLed (the issue's case, where the survivor used to wait 300 s in torchrun's exit barrier) and both stop
  at the same step boundary, the survivor at once.
- A rendezvous endpoint held by a silent program on 0.0.0.0 (a launcher that used to hang forever) is one line,
  exit 2.

Real processes, gloo, tiny-gpt. Outcomes never depend on timing: the kills wait for a checkpoint to exist, and a
test's `timeout` only bounds a hang.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import rank_pool
from rank_pool import free_port
from test_plans_match_single_process import ROOT, _env, make_plan
from test_signals_and_ownership import alive, children


# ---- the agreement check, on the pool's ranks --------------------------------------------------------------

NODES = {r: {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(r)} for r in range(2)}
"""Two ranks, each the only rank of its own node."""


def two_ranks(tmp_path: Path, argv: list, rank1: list | None = None):
    return rank_pool.shared().run(2, argv, cwd=ROOT, timeout=180, rank_argv={1: rank1} if rank1 else None,
                                  rank_env=NODES)


def tokens(path: Path, seed: int) -> Path:
    np.random.default_rng(seed).integers(0, 256, size=4096, dtype=np.uint16).tofile(path)
    return path


def test_ranks_that_disagree_stop_before_any_step_naming_the_rank_and_the_field(tmp_path):
    host = socket.gethostname()
    plan, other, same = tmp_path / "plan.json", tmp_path / "other.json", tmp_path / "copy" / "plan.json"
    plan.write_text(json.dumps(make_plan(dp=2)))
    other.write_text(json.dumps(make_plan(dp=2, micro=2)))  # another plan: two microbatches
    same.parent.mkdir()
    same.write_text(json.dumps(json.loads(plan.read_text()), indent=4))  # the same plan, written otherwise
    data, swapped, moved = tokens(tmp_path / "a.bin", 1), tokens(tmp_path / "b.bin", 2), tmp_path / "c.bin"
    moved.write_bytes(data.read_bytes())
    base = [str(plan), "--model", "tiny-gpt", "--steps", "2"]

    cases = [
        (base + ["--lr", "0.001"], base + ["--lr", "0.1"],
         f"the nodes disagree on --lr: rank 1 (host {host}) runs with --lr 0.1, rank 0 (host {host}) with --lr 0.001"),
        (base + ["--weight-decay", "0.1"], base + ["--weight-decay", "0.01"],  # the recipe's flags too (issue 46)
         f"the nodes disagree on --weight-decay: rank 1 (host {host}) runs with --weight-decay 0.01, rank 0 (host "
         f"{host}) with --weight-decay 0.1"),
        (base, [str(plan), "--model", "tiny-gpt", "--steps", "3"],
         f"the nodes disagree on --steps: rank 1 (host {host}) runs with --steps 3, rank 0 (host {host}) with "
         "--steps 2"),
        (base, [str(other), *base[1:]], f"the nodes disagree on the plan: rank 1 (host {host}) runs with {other} "
                                        "(content sha256 "),
        (base + ["--data", str(data)], base + ["--data", str(swapped)],
         f"the nodes disagree on the data (--data): rank 1 (host {host}) runs with content sha256 "),
    ]
    for rank0, rank1, line in cases:
        done = two_ranks(tmp_path, rank0, rank1)
        assert done.returncode == 2, (rank1, done.stderr)
        assert line in done.stderr, (rank1, done.stderr)
        assert done.stderr.count("partita: error:") == 1 and "Traceback" not in done.stderr, done.stderr
        assert "partita run:" not in done.stdout, done.stdout  # no rank began training
    refused = two_ranks(tmp_path, base, base + ["--data", str(tmp_path / "missing.bin")])
    assert refused.returncode == 2 and "the nodes disagree" not in refused.stderr, refused.stderr
    assert f"partita: error: token file {tmp_path / 'missing.bin'} does not exist" in refused.stderr  # what rank 1
    # could not check is not compared: its refusal is the line
    agreed = two_ranks(tmp_path, base + ["--data", str(data)], [str(same), *base[1:], "--data", str(moved)])
    assert agreed.returncode == 0, agreed.stderr  # the same content under other paths: the same job


# ---- two real nodes ------------------------------------------------------------------------------------------

def start_nodes(tmp_path: Path, args: list, node_args=([], []), plan: dict | None = None) -> tuple[list, str]:
    """Two `partita run` nodes of one 4-rank job on this machine, each in its own session; returns the
    processes (stdout and stderr in tmp_path/node<i>.out/.err) and the endpoint."""
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(plan or make_plan(dp=2, tp=2)))
    endpoint, job = f"127.0.0.1:{free_port()}", f"partita-test-{uuid.uuid4().hex[:8]}"
    procs = []
    for node in range(2):
        cmd = [sys.executable, "-m", "partita.cli", "run", str(plan_file), "--model", "tiny-gpt", *args,
               *node_args[node], "--nnodes", "2", "--rdzv-endpoint", endpoint, "--rdzv-id", job]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=_env(), text=True, start_new_session=True,
                                      stdout=open(tmp_path / f"node{node}.out", "w"),
                                      stderr=open(tmp_path / f"node{node}.err", "w")))
    return procs, endpoint


def stderr_of(tmp_path: Path, node: int) -> str:
    return (tmp_path / f"node{node}.err").read_text()


def tree(pid: int) -> list[int]:
    try:
        return [pid, *(q for c in children(pid) for q in tree(c))]
    except OSError:
        return [pid]


def wait_all(procs, timeout: float = 240) -> list[int]:
    """The nodes' exit codes; any node still running after `timeout` (a failed test) is killed with every
    process under it (its launcher runs in a session of its own)."""
    try:
        return [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                for pid in tree(p.pid):
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGKILL)
                p.wait()


def wait_for_dir(path: Path, procs, timeout: float = 240) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert all(p.poll() is None for p in procs), [p.returncode for p in procs]
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.2)


def store_host(procs, port: int) -> int:
    """The index of the node whose launcher listens on the rendezvous port (it hosts the store)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # LISTEN
                inodes.add(fields[9])
    for node, p in enumerate(procs):
        for pid in tree(p.pid):
            try:
                links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")}
            except OSError:
                continue
            if any(f"socket:[{i}]" in links for i in inodes):
                return node
    raise AssertionError(f"no launcher listens on port {port}")


@pytest.mark.slow
def test_two_nodes_started_with_other_steps_stop_in_one_line_each(tmp_path):
    procs, _ = start_nodes(tmp_path, [], node_args=(["--steps", "2"], ["--steps", "3"]))
    codes = wait_all(procs)
    for node in range(2):
        err = stderr_of(tmp_path, node)
        assert codes[node] == 2, err
        lines = [line for line in err.splitlines() if not line.startswith("partita: rendezvous at ")]
        assert len(lines) == 1, err
        assert re.fullmatch(r"partita: error: rank \d: the nodes disagree on --steps: rank \d \(host .+\) runs with "
                            r"--steps \d, rank 0 \(host .+\) with --steps \d: start every node with the same command, "
                            r"plan and data", lines[0]), err


@pytest.mark.slow
def test_a_node_killed_outright_is_named_by_the_other_which_stops(tmp_path):
    """Every process of the node that does not host the rendezvous store is SIGKILLed at once: the other node's
    workers lose their peers, and its launcher names the lost node (its launcher's pid) instead of a rank that
    only saw a connection reset."""
    ck = tmp_path / "ck"
    procs, endpoint = start_nodes(tmp_path, ["--steps", "100000", "--checkpoint-dir", str(ck),
                                             "--checkpoint-every", "2"])
    wait_for_dir(ck / "step-00000002", procs)
    host = store_host(procs, int(endpoint.rsplit(":", 1)[1]))
    victim = 1 - host
    agent = children(procs[victim].pid)[0]
    for pid in tree(procs[victim].pid):
        os.kill(pid, signal.SIGKILL)
    codes = wait_all([procs[host]], timeout=120)
    err = stderr_of(tmp_path, host)
    assert codes == [1], err
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(rf"partita: error: lost node {re.escape(socket.gethostname())} \(launcher pid {agent}\): no "
                        r"heartbeat for \d+ s -- it was killed, or its machine or network went down; this node stops "
                        rf"after step \d+ of 100000; resume from {re.escape(str(ck))}/step-\d{{8}} with --resume",
                        last), err
    assert "Traceback" not in err
    wait_all(procs)


@pytest.mark.slow
def test_a_killed_partita_run_stops_both_nodes_at_once(tmp_path):
    """The issue's case: SIGKILL one node's `partita run` -- the node that does not host the rendezvous store (had
    it hosted it, the store would go with it and wake the other node). Its launcher's workers stop the whole job
    at a step boundary (runtime.failure.stop.die_with_parent); the other node used to wait out torchrun's 300 s exit
    barrier for that launcher, silent, and now stops as soon as its own workers have."""
    ck = tmp_path / "ck"
    procs, endpoint = start_nodes(tmp_path, ["--steps", "100000", "--checkpoint-dir", str(ck),
                                             "--checkpoint-every", "2"])
    wait_for_dir(ck / "step-00000002", procs)
    host = store_host(procs, int(endpoint.rsplit(":", 1)[1]))
    every = [pid for p in procs for pid in tree(p.pid)]  # both launchers, their agents and workers
    procs[1 - host].send_signal(signal.SIGKILL)
    codes = wait_all([procs[host]], timeout=120)  # a bound on a hang: it used to take 301 s
    err = stderr_of(tmp_path, host)
    assert codes == [143], err
    assert re.fullmatch(r"partita: stopped by SIGTERM after step \d+ of 100000; resume from .*/step-\d{8} with "
                        r"--resume", err.strip().splitlines()[-1]), err
    wait_all(procs)
    end = time.monotonic() + 60  # the killed node's agent and workers end too (they stopped with the job)
    while alive(every) and time.monotonic() < end:
        time.sleep(0.5)
    assert not alive(every)


@pytest.mark.slow
def test_an_endpoint_held_by_a_silent_program_on_all_addresses_is_one_line(tmp_path):
    """A program listening on 0.0.0.0:P that never answers: a node given --rdzv-endpoint 0.0.0.0:P connected to
    it as a store client and hung there for good, deadline and signals ignored."""
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen(16)
        port = held.getsockname()[1]
        plan = tmp_path / "plan.json"
        plan.write_text(json.dumps(make_plan(dp=2, tp=2)))
        done = subprocess.run([sys.executable, "-m", "partita.cli", "run", str(plan), "--model", "tiny-gpt",
                               "--steps", "2", "--nnodes", "2", "--rdzv-endpoint", f"0.0.0.0:{port}",
                               "--rdzv-timeout", "10"], cwd=ROOT, env=_env(), capture_output=True, text=True,
                              timeout=180)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"partita: error: rendezvous endpoint 0.0.0.0:{port}: the port is held by another program, not a rendezvous "
        "store: choose a free port for --rdzv-endpoint (the same on every node)"], done.stderr
