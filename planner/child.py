"""Start the training launcher as a child process and stay its parent until it ends, passing signals on.

`partita run` (and runtime.api.launch) start `python -m partita.runtime.train ... --nproc-per-node W`, which
is torchrun's agent for this node, in a session of its own: a Ctrl-C at the terminal reaches only this
process, and a SIGTERM / SIGINT / SIGHUP sent here is passed to the launcher once -- it passes it to its
workers, which stop at a step boundary and say where (runtime.stop). A second signal kills the launcher
(SIGKILL); its workers then get SIGTERM from the kernel (they asked for it, runtime.stop.die_with_parent) and
stop the same way. The launcher in turn asks for SIGTERM when this process dies, so killing `partita run`
itself with SIGKILL leaves no training behind either. A launcher killed by a signal is one line, not a
silent exit code 247.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run_forwarding_signals(cmd: list[str], env: dict) -> int:
    """Run `cmd` to its end with the signals of the module docstring passed on; returns its exit code
    (128 + N when a signal N ended it)."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    received: list[int] = []

    def forward(signum, frame):
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL if received else signum)
        received.append(signum)

    main = threading.current_thread() is threading.main_thread()  # only the main thread may set handlers
    previous = {s: signal.signal(s, forward) for s in FORWARDED} if main else {}
    try:
        code = proc.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if code >= 0:
        return code
    why = " after a second signal" if len(received) > 1 else ""
    print(f"partita: error: the launcher (pid {proc.pid}) was killed by {signal.Signals(-code).name}{why}; its "
          "workers stop at their next step boundary", file=sys.stderr, flush=True)
    return 128 - code
