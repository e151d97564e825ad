"""`partita run` under the faults an operator meets (issue 29), through the real launcher: torchrun's agent in
its own process, 2 gloo workers. Each case launches torchrun once or more (10-30 s on 2 shared cores): `slow`.
The one-process counterparts are in tests/runtime/test_checkpoint_faults.py and test_launcher_lines.py.

- SIGTERM to `partita run` stops every worker at a step boundary with a checkpoint and one line; --resume goes on;
- Ctrl-C (SIGINT to the terminal's process group) is one line, no tracebacks;
- a SIGKILLed launcher leaves no worker training, and `partita run` says so in one line;
- a worker killed by SIGKILL (as the out-of-memory killer does) is named as the cause;
- a NaN is final under --max-restarts, and keeps the loss history; a restart is counted "(restart 1 of 1)";
- two runs started at once on one checkpoint directory: one trains, the other stops in one line;
- a check that only one rank fails before training (its own environment, or shared state it read at
  another moment than its peers) ends every rank with that rank's line, instead of leaving the others
  waiting in their first collective (the cause of the two-runs case hanging one run in CI);
- a rendezvous whose second node never comes: progress lines and one line when --rdzv-timeout expires.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from partita.runtime import checkpoint as ckpt
from rank_pool import free_port
from test_plans_match_single_process import ROOT, _env, make_plan

pytestmark = pytest.mark.slow


def start(tmp_path: Path, *args: str, plan: dict | None = None, env: dict | None = None, name: str = "run",
          new_session: bool = False, **popen) -> subprocess.Popen:
    """`partita run` on a 2-rank dp plan (or `plan`) with its temporary files under tmp_path (TMPDIR); `popen`:
    other arguments of subprocess.Popen (stdout, stderr, preexec_fn ...; stdout and stderr default to pipes)."""
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(plan or make_plan(dp=2)))
    (tmp_path / "tmp").mkdir(exist_ok=True)
    popen = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **popen}
    return subprocess.Popen([sys.executable, "-m", "partita.cli", "run", str(path), "--model", "tiny-gpt",
                             *args], cwd=ROOT, env=_env(TMPDIR=str(tmp_path / "tmp"), **(env or {})), text=True,
                            start_new_session=new_session, **popen)


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.2)


def alive(pids: list[int]) -> list[int]:
    def running(pid):
        try:
            return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
        except OSError:
            return False
    return [p for p in pids if running(p)]


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_sigterm_stops_every_worker_at_a_step_boundary_and_resume_goes_on(tmp_path):
    ck = tmp_path / "ck"
    proc = start(tmp_path, "--steps", "1000", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                 "--losses-out", str(tmp_path / "out.json"))
    wait_for(ck / "step-00000002", proc)
    workers = [w for agent in children(proc.pid) for w in children(agent)]
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("partita: stopped by SIGTERM after step "), err
    step = int(lines[0].split("after step ")[1].split()[0])
    assert lines[0].endswith(f"resume from {ck / f'step-{step:08d}'} with --resume")
    assert ckpt.latest(ck).name == f"step-{step:08d}" and not ckpt.incomplete(ck)
    assert alive(workers) == [] and list((tmp_path / "tmp").glob("partita-torchrun-*")) == []
    history = json.loads((tmp_path / "out.json").read_text())
    assert len(history["losses"]) == step and history["exit_code"] == 143

    proc = start(tmp_path, "--steps", str(step + 2), "--checkpoint-dir", str(ck), "--resume",
                 "--losses-out", str(tmp_path / "resumed.json"))
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    resumed = json.loads((tmp_path / "resumed.json").read_text())
    assert resumed["first_step"] == step and len(resumed["losses"]) == 2
    print(f"stopped after step {step}; resumed for {resumed['losses']}")


def test_ctrl_c_is_one_line(tmp_path):
    ck = tmp_path / "ck"
    proc = start(tmp_path, "--steps", "1000", "--checkpoint-dir", str(ck), "--checkpoint-every", "2",
                 new_session=True)
    wait_for(ck / "step-00000002", proc)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the foreground process group
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("partita: stopped by SIGINT after step "), err
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err + out


def test_a_signal_to_one_worker_stops_the_whole_job(tmp_path):
    """A scheduler or an operator signals rank 1 alone (PARTITA_FAULT sigterm): every rank stops after step 3."""
    ck = tmp_path / "ck"
    proc = start(tmp_path, "--steps", "8", "--checkpoint-dir", str(ck), "--checkpoint-every", "5",
                 env={"PARTITA_FAULT": "sigterm,rank=1,step=3"})
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == (f"partita: stopped by SIGTERM after step 3 of 8; resume from "
                                            f"{ck / 'step-00000003'} with --resume"), err
    assert [p.name for p in ckpt.steps(ck)] == ["step-00000003"]


def test_a_killed_launcher_leaves_no_worker_training(tmp_path):
    ck = tmp_path / "ck"
    proc = start(tmp_path, "--steps", "1000", "--checkpoint-dir", str(ck), "--checkpoint-every", "2")
    wait_for(ck / "step-00000002", proc)
    agent = children(proc.pid)[0]
    workers = children(agent)
    os.kill(agent, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 137
    assert err.strip() == (f"partita: error: the launcher (pid {agent}) was killed by SIGKILL; its workers stop at "
                           "their next step boundary")
    end = time.monotonic() + 60
    while alive(workers) and time.monotonic() < end:
        time.sleep(0.2)
    assert alive(workers) == []
    assert not ckpt.incomplete(ck) or all(p.name.startswith(".step-") for p in ckpt.incomplete(ck))
    ckpt.open_checkpoint(ckpt.latest(ck))  # the newest checkpoint is complete


def test_a_worker_killed_by_sigkill_is_named_as_the_cause(tmp_path):
    """Rank 1 is SIGKILLed in step 3 and writes nothing; rank 0 then fails on the lost connection."""
    proc = start(tmp_path, "--steps", "5", env={"PARTITA_FAULT": "kill,rank=1,step=3"})
    out, err = proc.communicate(timeout=240)
    assert proc.returncode != 0
    assert err.strip().splitlines()[-1] == "partita: error: rank 1: killed by SIGKILL (out of memory?)", err
    assert list((tmp_path / "tmp").glob("partita-torchrun-*")) == []


def test_a_nan_is_not_restarted_and_a_restart_is_counted(tmp_path):
    ck = tmp_path / "ck"
    proc = start(tmp_path, "--steps", "5", "--max-restarts", "2", "--checkpoint-dir", str(ck),
                 "--checkpoint-every", "1", "--losses-out", str(tmp_path / "nan.json"),
                 env={"PARTITA_FAULT": "nan,step=3"})
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 3, err
    assert "restarts the workers" not in err and len(err.strip().splitlines()) == 1, err
    assert "loss is nan at step 3" in err and len(json.loads((tmp_path / "nan.json").read_text())["losses"]) == 2

    proc = start(tmp_path, "--steps", "3", "--max-restarts", "1", "--checkpoint-dir", str(tmp_path / "ck2"),
                 "--checkpoint-every", "1", "--losses-out", str(tmp_path / "restart.json"),
                 env={"PARTITA_FAULT": "rank=1,step=2"})
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "partita: rank 1: exited with code 1; torchrun restarts the workers (restart 1 of 1)" in err, err
    result = json.loads((tmp_path / "restart.json").read_text())
    assert result["attempt"] == 2 and result["restarts"] == 1 and "torchrun attempt 2" in out


def test_two_runs_on_one_directory_one_trains_the_other_stops(tmp_path):
    ck = tmp_path / "ck"
    runs = [start(tmp_path, "--steps", "6", "--checkpoint-dir", str(ck), "--checkpoint-every", "1",
                  "--losses-out", str(tmp_path / f"{i}.json"), name=f"run{i}") for i in range(2)]
    done = [(p.returncode, *p.communicate(timeout=300)) for p in runs]
    codes = sorted(p.returncode for p in runs)
    assert codes == [0, 2], done
    err = next(e for p, (_, _, e) in zip(runs, done) if p.returncode == 2)
    assert err.startswith("partita: error: ") and len(err.strip().splitlines()) == 1, err
    assert "is in use by another run" in err or "a new run does not overwrite them" in err, err
    run_id = {ckpt.open_checkpoint(p).manifest["run_id"] for p in ckpt.steps(ck)}
    assert len(run_id) == 1 and [p.name for p in ckpt.steps(ck)][-1] == "step-00000006"


def test_a_refusal_on_one_rank_ends_every_rank(tmp_path):
    """Two workers without torchrun (env:// rendezvous); only rank 1 reads a PARTITA_FAULT it cannot parse, so
    only its checks refuse. Before the ranks agreed on the outcome, rank 0 went on alone and hung."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps(make_plan(dp=2)))
    port = free_port()
    procs = []
    for rank in range(2):
        env = _env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   TORCHELASTIC_ERROR_FILE=str(tmp_path / f"error{rank}.json"))
        env.pop("PARTITA_FAULT", None)
        if rank == 1:
            env["PARTITA_FAULT"] = "bogus"
        procs.append(subprocess.Popen([sys.executable, "-m", "partita.runtime.train", str(plan), "--model",
                                       "tiny-gpt", "--steps", "2"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    try:
        done = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [2, 2], done
    line = done[0][1].strip().splitlines()[-1]
    assert line.startswith("partita: error: PARTITA_FAULT='bogus': cannot read 'bogus'"), done
    assert done[1][1].strip() == "", done  # rank 0 says it once
    for rank in range(2):  # torchrun's error files name the rank that refused
        said = json.loads((tmp_path / f"error{rank}.json").read_text())["message"]
        assert said["extraInfo"]["partita"]["rank"] == 1 and said["message"] in line, said


def test_a_missing_node_times_out_with_progress_and_one_line(tmp_path):
    port = free_port()
    proc = start(tmp_path, "--steps", "2", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
                 "--rdzv-timeout", "6", plan=make_plan(dp=2, tp=2))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    lines = err.strip().splitlines()
    assert any(f"partita: rendezvous at 127.0.0.1:{port}: 1 of 2 nodes joined" in line for line in lines), err
    assert lines[-1] == (f"partita: error: rendezvous at 127.0.0.1:{port} timed out after 6 s with 1 of 2 nodes "
                         "joined: start the same command on every node, or give them longer with --rdzv-timeout"), err
    assert all(line.startswith("partita: ") for line in lines), err
