"""A launcher killed by SIGKILL leaves its workers running until their step boundary, writing into the launcher's
directory meanwhile (hang marks, the steps they passed). `partita run` (runtime.launcher.child) waits for them
before it removes the directory. Before: it removed the directory at once, and a worker's write racing the removal
left it behind (CI, 2026-11-28: test_a_killed_launcher_leaves_no_directory_... failed once in 2,392 tests).

No torchrun here: the "launcher" is a Python process that starts a "worker" (inheriting its environment, as
torchrun's workers do) and is then SIGKILLed; the worker goes on writing into the directory for a while."""
import os
import signal
import sys
import textwrap
from pathlib import Path

from partita.runtime.launcher import child

WORKER = textwrap.dedent("""
    import os, sys, time
    d = os.environ["{env}"]
    open(sys.argv[1], "w").write(str(os.getpid()))
    for i in range(15):  # about 1.5 s of writes after the launcher died, recreating what a removal took
        time.sleep(0.1)
        os.makedirs(d, exist_ok=True)
        open(os.path.join(d, "mark.json"), "w").write(str(i))
    open(sys.argv[2], "w").write("stopped")
""")

LAUNCHER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2], sys.argv[3]])
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.02)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def test_a_killed_launchers_workers_are_waited_for_and_the_directory_goes(tmp_path, monkeypatch):
    made = []
    real = child.tempfile.mkdtemp
    monkeypatch.setattr(child.tempfile, "mkdtemp", lambda **kw: made.append(real(**{**kw, "dir": tmp_path})) or made[-1])
    pid_file, stopped = tmp_path / "worker.pid", tmp_path / "stopped"
    worker = WORKER.format(env=child.LOG_DIR_ENV)
    code = child.run_forwarding_signals([sys.executable, "-c", LAUNCHER, worker, str(pid_file), str(stopped)],
                                        dict(os.environ))
    assert code == 128 + signal.SIGKILL
    assert stopped.read_text() == "stopped", "returned before the killed launcher's worker had stopped"
    assert not Path(made[0]).exists() and list(tmp_path.glob(f"{child.LOG_DIR_PREFIX}*")) == []
    assert len(made) == 2 and not Path(made[1]).exists()  # the node's snapshot directory goes too
    assert child.left_behind(made[0]) == []


def test_left_behind_finds_only_the_processes_of_that_directory(tmp_path):
    import subprocess
    mine, other = str(tmp_path / "a"), str(tmp_path / "b")
    procs = [subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(30)"],
                              env={**os.environ, child.LOG_DIR_ENV: d}, stdout=subprocess.PIPE) for d in (mine, other)]
    for p in procs:  # started: until its exec, a forked child's /proc environ is still its parent's
        assert p.stdout.readline() == b"up\n"
    try:
        assert child.left_behind(mine) == [procs[0].pid] and child.left_behind(other) == [procs[1].pid]
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert child.left_behind(mine) == []
