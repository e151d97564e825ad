"""A rendezvous store in a process of its own (`partita rendezvous`, runtime.launcher.store): an elastic job survives
the loss of the node that would otherwise serve its store.

`partita rendezvous --port P` starts first; three local nodes (`partita run SET --nnodes 2:3`, test_elastic's plan
set) then join at 127.0.0.1:P. Node 0 -- the first started, the one whose agent serves the store when nobody else
does (it is the endpoint's host and the first to take the port) -- is SIGKILLed (launcher, agent and worker) once
step 3's checkpoint exists. The other two re-plan for 2 nodes and resume; their last round's losses are one
uninterrupted process's within 1e-5 (--verify). Served by node 0 instead, its loss would have ended the job. The
store then stops on SIGTERM with exit 0. `slow`: about 35 s on 2 shared cores.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import uuid

import pytest

from rank_pool import free_port
from test_elastic import STEPS, _children, _listening, _logs, _wait, plan_set, start_node
from test_plans_match_single_process import ROOT, _env


def _store(port: int, out) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "partita.cli", "rendezvous", "--port", str(port)], cwd=ROOT,
                            env=_env(), stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_an_elastic_job_outlives_the_node_that_would_serve_its_store(tmp_path):
    sets, ck = plan_set(tmp_path / "set"), tmp_path / "ck"
    port, job = free_port(), f"partita-test-{uuid.uuid4().hex[:8]}"
    store = _store(port, open(tmp_path / "store.log", "w"))
    nodes = []
    try:
        _wait(lambda: _listening(port), procs=[store])
        env = _env()
        nodes = [start_node(tmp_path, i, sets, port, job, env, "--rescale-every", "0") for i in range(3)]
        _wait(lambda: True if (ck / "step-00000003").is_dir() else None, procs=nodes)
        for p in [*_children(nodes[0].pid), nodes[0].pid]:
            os.kill(p, signal.SIGKILL)
        nodes[0].wait()
        codes = [p.wait(timeout=300) for p in nodes[1:]]
    except AssertionError as e:
        raise AssertionError(f"{e}: {_logs(tmp_path)}") from None
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
        store.send_signal(signal.SIGTERM)
        stopped = store.wait(timeout=30)
    outputs = _logs(tmp_path)
    assert codes == [0, 0], outputs
    stderr = "".join(v for k, v in outputs.items() if k.endswith(".err"))
    lost = re.search(r"partita: 1 node\(s\) lost before step (\d+): re-planned for 2 nodes \(pp=1 dp=2 tp=1, "
                     r"predicted 0\.67x the 3-node throughput\); resumed from step (\d+)\n", stderr)
    assert lost and int(lost[2]) == int(lost[1]) - 1 >= 3, outputs
    reports = [json.loads(f.read_text()) for f in tmp_path.glob("node*.json")]
    last = max(reports, key=lambda r: r["first_step"])
    assert last["first_step"] == int(lost[2]) and len(last["losses"]) == STEPS - last["first_step"], last
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
