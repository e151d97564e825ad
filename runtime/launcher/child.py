"""Start the training launcher as a child process and stay its parent until it ends, passing signals on.

`partita run` (and runtime.api.launch) start `python -m partita.runtime.train ... --nproc-per-node W`, which
is torchrun's agent for this node, in a session of its own: a Ctrl-C at the terminal reaches only this
process, and a SIGTERM / SIGINT / SIGHUP / SIGQUIT sent here is passed to the launcher once -- it passes it
to its workers, which stop at a step boundary and say where (runtime.failure.stop). A SIGHUP (a closed terminal,
a dropped ssh connection) is forwarded too, and one ignored from the start stays ignored (`nohup`). A second
signal other than SIGHUP kills the launcher (SIGKILL); its workers then get SIGTERM from the kernel (they
asked for it, runtime.failure.stop.die_with_parent) and stop the same way. A SIGHUP after the first signal is not a
second request, and is not passed on: a closing terminal may send it twice (the shell passes its own on,
and the kernel signals the foreground group when the shell exits). The launcher in turn asks for SIGTERM when this process dies, so killing
`partita run` itself with SIGKILL leaves no training behind either. A launcher killed by a signal is one
line, not a silent exit code 247.

The launcher's working directory (torchrun's log directory, where the workers leave their error files and
the steps they passed) is made here, named in LOG_DIR_ENV, and removed here when the launcher has ended:
this process outlives a launcher killed by SIGKILL, which cannot clean up after itself. Such a launcher's
workers outlive it too, for as long as they take to reach their step boundary, writing into the directory
meanwhile: this process waits for them (`left_behind`), passing signals on to them as it did to the launcher,
and only then removes it (removing it beside them raced their writes and could leave it behind).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""runtime.failure.stop.SIGNALS, the signals that stop a run (this layer cannot import runtime)."""
REPEATABLE = (signal.SIGHUP,)
"""Signals that may arrive twice for one event: forwarded once, never escalated to SIGKILL."""
LOG_DIR_ENV = "PARTITA_LOG_DIR"
"""The launcher's working directory, made and removed by `run_forwarding_signals` (runtime.api.agent)."""
LOG_DIR_PREFIX = "partita-torchrun-"
SNAPSHOT_DIR_ENV = "PARTITA_SNAPSHOT_DIR"
"""The node's directory for snapshots of the training state in memory (runtime.checkpoint.snapshot): made and
removed here beside the launcher's, on the node's tmpfs, so that it outlives every restart of the workers."""
SNAPSHOT_ROOT_ENV = "PARTITA_SNAPSHOT_ROOT"
"""Where the snapshot directory is made: /dev/shm (memory) by default, the temporary directory where there is none."""
POLL_S = 0.2
"""How often a killed launcher's workers are looked for while they stop."""


def _forwarded() -> list[signal.Signals]:
    """FORWARDED, less a SIGHUP this process was started ignoring (nohup)."""
    return [s for s in FORWARDED if not (s == signal.SIGHUP and signal.getsignal(s) is signal.SIG_IGN)]


def run_forwarding_signals(cmd: list[str], env: dict) -> int:
    """Run `cmd` to its end with the signals of the module docstring passed on; returns its exit code
    (128 + N when a signal N ended it). The launcher's working directory is removed after it and its workers
    ended, however they ended."""
    log_dir = tempfile.mkdtemp(prefix=LOG_DIR_PREFIX)
    root = _snapshot_root(env)
    _remove_stale_snapshots(root)
    snapshots = tempfile.mkdtemp(prefix=f"{_snapshot_prefix()}{os.getpid()}-", dir=root)
    try:
        return _run(cmd, {**env, LOG_DIR_ENV: log_dir, SNAPSHOT_DIR_ENV: snapshots}, log_dir)
    finally:
        _remove(log_dir)
        shutil.rmtree(snapshots, ignore_errors=True)


def _snapshot_prefix() -> str:
    """partita-snapshots-<pid namespace>-: a directory's maker is known by its pid only within its pid namespace
    (another container sharing /dev/shm has its own)."""
    try:
        space = os.readlink("/proc/self/ns/pid").split("[")[-1].rstrip("]")
    except OSError:
        space = "0"
    return f"partita-snapshots-{space}-"


def _remove_stale_snapshots(root: str | None) -> None:
    """Remove the snapshot directories of `partita run` processes of this pid namespace that are gone without
    removing them (SIGKILL, the out-of-memory killer): their tmpfs memory would stay taken until the machine
    restarts. A directory whose maker lives, or of another namespace or user, is left alone."""
    root, prefix = root or tempfile.gettempdir(), _snapshot_prefix()
    try:
        names = [n for n in os.listdir(root) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid, path = name[len(prefix):].split("-", 1)[0], os.path.join(root, name)
        try:
            if not pid.isdigit() or os.stat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:  # alive under another user (EPERM), or gone already
            continue


def _snapshot_root(env: dict) -> str | None:
    root = env.get(SNAPSHOT_ROOT_ENV) or os.environ.get(SNAPSHOT_ROOT_ENV)
    if root:
        return root
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def _run(cmd: list[str], env: dict, log_dir: str) -> int:
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    received: list[int] = []

    def forward(signum, frame):
        if not received or signum not in REPEATABLE:
            for pid in [proc.pid] if proc.poll() is None else left_behind(log_dir):
                _kill(pid, signal.SIGKILL if received else signum)
        received.append(signum)

    main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    previous = {s: signal.signal(s, forward) for s in _forwarded()} if main else {}
    try:
        code = proc.wait()
        if code < 0:
            escalated = code == -signal.SIGKILL and any(s not in REPEATABLE for s in received[1:])
            why = " after a second signal" if escalated else ""
            _stderr_line(f"partita: error: the launcher (pid {proc.pid}) was killed by {signal.Signals(-code).name}"
                         f"{why}; its workers stop at their next step boundary")
        while left_behind(log_dir):  # a killed launcher's workers: signals still reach them (`forward`)
            time.sleep(POLL_S)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return code if code >= 0 else 128 - code


def left_behind(log_dir: str) -> list[int]:
    """The live processes started under the launcher of `log_dir` (their environment names it in LOG_DIR_ENV):
    once the launcher has ended, the workers of a launcher that was killed, stopping at their step boundary
    and still writing into `log_dir`. Read from /proc (Linux); elsewhere none are known."""
    mark = f"{LOG_DIR_ENV}={log_dir}".encode()
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()) if os.path.isdir("/proc") else ():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if mark not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] != "Z":  # a zombie has ended
                    found.append(pid)
        except (OSError, IndexError):
            continue
    return found


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:  # it ended meanwhile
        pass


def _remove(log_dir: str, tries: int = 50) -> None:
    """Remove `log_dir`, again while a process the /proc scan cannot see still adds to it (a removal that
    races a new file leaves the directory)."""
    for _ in range(tries):
        shutil.rmtree(log_dir, ignore_errors=True)
        if not os.path.exists(log_dir):
            return
        time.sleep(POLL_S)


def _stderr_line(text: str) -> None:
    """One line on stderr, dropped when stderr is gone (a closed terminal): it must not change the exit code."""
    try:
        print(text, file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
