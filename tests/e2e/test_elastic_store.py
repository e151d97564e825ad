"""A rendezvous store in a process of its own (`partita rendezvous`, runtime.launcher.store) and idle spares
(runtime.launcher.rendezvous.is_spare): an elastic job survives the loss of the node that would otherwise serve its
store, and a spare takes the lost node's place without a re-plan.

`partita rendezvous --port P` starts first; three local nodes (`partita run SET --nnodes 2:3`, test_elastic's plan
set) join at 127.0.0.1:P, and rank 1 pauses in step 4. Two more nodes then start: the job runs at its largest size,
so they wait as spares (torch's redundancy list) and each says so. Node 0 -- the first started, the one whose
agent serves the store when nobody else does (it is the endpoint's host and the first to take the port) -- is
SIGKILLed (launcher, agent and worker). A spare takes its place: the job goes on on 3 nodes under the same plan
from step 3's checkpoint, its losses one uninterrupted process's within 1e-5 (--verify); the node left over (the
other spare, or a survivor that came back after both spares filled the round) is told, at the job's end, that it
was not needed. Every node left exits 0, and the store stops on SIGTERM with exit 0.
Served by node 0 instead, its loss would have ended the job (checked by hand: the survivors exit 1 within
seconds). `slow`: about 40 s on 2 shared cores.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid

import pytest

from rank_pool import free_port
from test_elastic import (STEPS, _listening, _logs, _stopped_under, _wait, kill_node, plan_set, running_nodes,
                          start_node)
from test_plans_match_single_process import ROOT, _env

SPARE = "waits as a spare at 127.0.0.1:{port}: the job runs on its largest size, 3 nodes; it takes the place of the " \
        "first node lost"


def _store(port: int, out) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "partita.cli", "rendezvous", "--port", str(port)], cwd=ROOT,
                            env=_env(), stdout=out, stderr=subprocess.STDOUT)


def _said(tmp_path, i: int, text: str):
    path = tmp_path / f"node{i}.err"
    return True if path.exists() and text in path.read_text() else None


@pytest.mark.slow
def test_an_elastic_job_outlives_the_node_that_would_serve_its_store_and_a_spare_takes_its_place(tmp_path):
    sets = plan_set(tmp_path / "set")
    port, job = free_port(), f"partita-test-{uuid.uuid4().hex[:8]}"
    store = _store(port, open(tmp_path / "store.log", "w"))
    try:
        with running_nodes(tmp_path) as nodes:
            _wait(lambda: _listening(port), procs=[store])
            env = _env(PARTITA_FAULT="sigstop,rank=1,step=4")
            nodes.extend(start_node(tmp_path, i, sets, port, job, env, "--rescale-every", "0") for i in range(3))
            paused_on = _wait(lambda: next((i for i in range(3) if _stopped_under(nodes[i].pid)), None), procs=nodes)
            paused = _stopped_under(nodes[paused_on].pid)
            nodes.extend(start_node(tmp_path, i, sets, port, job, env, "--rescale-every", "0") for i in (3, 4))
            _wait(lambda: _said(tmp_path, 3, SPARE.format(port=port)) and _said(tmp_path, 4, SPARE.format(port=port)),
                  procs=nodes)
            kill_node(nodes[0])
            if paused_on != 0:
                os.kill(paused, signal.SIGCONT)
            codes = [p.wait(timeout=300) for p in nodes[1:]]
    finally:
        store.send_signal(signal.SIGTERM)
        stopped = store.wait(timeout=30)
    outputs = _logs(tmp_path)
    assert codes == [0, 0, 0, 0], outputs
    # the round after the loss takes the first 3 nodes that come: a spare or both (then a survivor whose workers
    # restarted late finds the round full and waits as a spare itself); the one left over is released at the end
    took = [i for i in (3, 4) if "this spare node takes a lost node's place: the job goes on on 3 nodes" in
            outputs[f"node{i}.err"]]
    released = [i for i in range(1, 5) if f"the job at 127.0.0.1:{port} ended without needing this spare node" in
                outputs[f"node{i}.err"]]
    assert took and len(released) == 1 and released[0] not in took, outputs
    assert "re-planned" not in "".join(outputs.values()), outputs  # the same size: the same plan goes on
    reports = [json.loads(f.read_text()) for f in tmp_path.glob("node*.json")]
    last = max(reports, key=lambda r: r["first_step"])
    assert last["first_step"] == 3 and len(last["losses"]) == STEPS - 3, last
    assert last["verified"] and last["max_abs_diff"] <= 1e-5, last
    log = (tmp_path / "store.log").read_text()
    assert stopped == 0 and "serving on" in log and f"store on port {port} stopped (SIGTERM)" in log, log


def test_a_port_the_store_cannot_take_is_one_line(tmp_path):
    port = free_port()
    first = _store(port, subprocess.PIPE)
    try:
        _wait(lambda: _listening(port), procs=[first])
        second = subprocess.run([sys.executable, "-m", "partita.cli", "rendezvous", "--port", str(port)], cwd=ROOT,
                                env=_env(), capture_output=True, text=True, timeout=60)
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=30)
    assert second.returncode == 2, second
    lines = second.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"partita: error: cannot serve a rendezvous store on port {port} ")
    assert lines[0].endswith("choose a free port"), lines
