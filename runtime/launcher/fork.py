"""Workers forked from the launcher instead of started as new interpreters (torchrun's `start_method="fork"`
with a function for an entry point), where that is safe: a torch built without CUDA.

Why: a worker started as `python -m partita.runtime.train` spends about 3.5 CPU-seconds importing before it
does anything (torch 1.5 s; torch._dynamo 1.7 s, which torch.optim imports on the first optimizer step; FSDP,
DTensor, DCP and partita's loop). The launcher has already paid for torch and the plan's modules (its
pre-flight check); it imports the rest once (`preload`), and every forked worker starts with them loaded.
On this project's 2-core machine a 2-rank tiny `partita run` goes from about 13 to about 5.5 CPU-seconds
(9.6 to 5.5 s of wall time); the tests launch hundreds of such runs.

Why not on a GPU host: a process that has touched the CUDA driver cannot be forked safely, and the launcher
asks torch about devices. There (and wherever `PARTITA_WORKER_START=spawn`), the workers start as new
interpreters, as torchrun starts them.

What a forked worker does differently from a spawned one, and why it does not matter:
- it inherits the launcher's signal handlers; `worker` installs the workers' own (runtime.failure.stop) first;
- it inherits the launcher's atexit handlers; they are dropped, and only the worker's own run at its end;
- its stdout/stderr are the launcher's: written through, as torchrun's `python -u` workers write them.
"""
from __future__ import annotations

import contextlib
import functools
import os
import signal
import sys

START_ENV = "PARTITA_WORKER_START"
"""`fork` or `spawn`: how the launcher starts its workers (default: fork where `can_fork`)."""


def can_fork() -> bool:
    """Whether this launcher forks its workers: asked for by START_ENV, else a torch built without CUDA
    (nothing here may initialise a GPU before the fork, so the build is what is looked at, not the devices)."""
    asked = os.environ.get(START_ENV, "").strip().lower()
    if asked in ("fork", "spawn"):
        return asked == "fork"
    import torch
    return torch.version.cuda is None and getattr(torch.version, "hip", None) is None


def preload() -> None:
    """Import, once in the launcher, what every worker imports: the training session (FSDP, DTensor, DCP)
    and torch._dynamo (torch.optim imports it at the first step)."""
    import importlib
    for module in ("torch._dynamo", "partita.runtime.loop.session"):
        importlib.import_module(module)


def beside_preload(check) -> int:
    """`check()` (the launcher's pre-flight, an exit code) in a forked child while this process runs `preload`:
    on two cores the two take about the time of the longer, not the sum (about half a second of a tiny run).
    What the check writes to stderr comes back through a pipe and is written here, so it reaches whatever this
    process's sys.stderr is (a caller that captures it, too). A child that dies by a signal counts as exit
    code 1."""
    import io
    _flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the check, then out without this process's teardown
        os.close(read)
        code, sys.stderr = 1, io.StringIO()
        try:
            from partita.runtime.failure.stop import die_with_parent
            die_with_parent(signal.SIGKILL)
            code = check()
        except KeyboardInterrupt:
            code = 128 + signal.SIGINT
        except BaseException:  # as an uncaught exception in the launcher would end: its traceback, exit 1
            import traceback
            traceback.print_exc()
        finally:
            with contextlib.suppress(OSError):
                with os.fdopen(write, "wb") as pipe:
                    pipe.write(sys.stderr.getvalue().encode("utf-8", "replace"))
            os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)
    os.close(write)
    try:
        preload()
    finally:
        with os.fdopen(read, "rb") as pipe:  # until the child has written and ended
            said = pipe.read().decode("utf-8", "replace")
        _, status = os.waitpid(pid, 0)
    if said:
        sys.stderr.write(said)
        sys.stderr.flush()
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 1


def worker(*argv: str) -> None:
    """A forked worker's entry point (torchrun's `_wrap` has set this rank's environment): train as
    `python -m partita.runtime.train ARGV` would, and end with its exit code."""
    import atexit

    from partita.runtime.failure.stop import StopSignal, die_with_parent, handled
    from partita.runtime.train import AGENT_ENV, main
    launcher = os.getppid()
    atexit._clear()  # the launcher's handlers are not this worker's to run
    for s in handled():  # nor its signal handlers (torchrun's raise in the agent): as a new process has them
        signal.signal(s, signal.SIG_DFL if s != signal.SIGINT else signal.default_int_handler)
    StopSignal.current = None
    stop = StopSignal().install()
    if os.environ.get(AGENT_ENV):
        die_with_parent()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(write_through=True, line_buffering=True)
        except (AttributeError, ValueError, OSError):
            pass
    code = main(list(argv))
    import threading
    shutdown = getattr(threading, "_shutdown", None)  # joins this worker's non-daemon threads, as an exit does
    if shutdown is not None:
        shutdown()
    atexit._run_exitfuncs()
    if code:
        raise SystemExit(code)  # multiprocessing ends the process with this code
    # A worker that returns waits for its launcher to collect the result (torchrun's `_wrap`). A launcher that
    # dies from now on ends it (the SIGTERM of die_with_parent, no longer a stop request); one already gone
    # never will collect it.
    stop.restore()
    if os.getppid() != launcher:
        _flush()
        os._exit(0)


def run_torchrun(argv: list[str], worker_argv: list[str]) -> None:
    """torchrun's `run` on its command line `argv`, with the workers forked from this process where
    `can_fork` says that is safe (the modules they need imported here first), else started as
    `python -m partita.runtime.train WORKER_ARGV` as torchrun starts them."""
    import uuid

    from torch.distributed import run as torchrun
    from torch.distributed.launcher.api import elastic_launch

    args = torchrun.parse_args(argv)
    if not can_fork():
        torchrun.run(args)
        return
    preload()
    args.start_method = "fork"
    if args.standalone:  # what torchrun.run does before its config_from_args
        args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id = "c10d", "localhost:0", str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500
    config, _, _ = torchrun.config_from_args(args)
    _flush()  # a forked worker must not write this process's buffered text again
    with released_on_stop():
        elastic_launch(config=config, entrypoint=worker)(*worker_argv)


RELEASE_WAIT = 1.0
"""Seconds `released_on_stop` waits to let the workers go before it stops them anyway (see there)."""


@contextlib.contextmanager
def released_on_stop():
    """While torchrun's agent runs forked workers here: when it stops them (a stop signal, a restart after a
    failure, an elastic job's new round), the workers that have returned are let go at once.

    A forked worker that returns waits until the agent has read its result (torchrun's `_wrap` waits on the
    context's `_worker_finished_event`, which only its `_poll` sets once every worker is done). An agent that is
    stopping its workers never reads them, so each stop waited out torch's 30 s close timeout and then a
    SIGKILL. Measured on a 2-rank tiny run here: Ctrl-C after step 2 ended the job 30.3 s later; an elastic
    round change waited from the stop step's checkpoint at 59.8 s to the next round at 89.6 s.

    torch warns that setting the event can deadlock if a worker died inside its `wait` (the event's
    `notify_all` then waits for that dead waiter's acknowledgement): it is set from a daemon thread that is
    given RELEASE_WAIT seconds, after which the stop goes on as torch's own (30 s, then SIGKILL)."""
    import threading

    from torch.distributed.elastic.multiprocessing.api import MultiprocessContext
    close = MultiprocessContext._close

    @functools.wraps(close)
    def released(context, *args, **kwargs):
        finished = getattr(context, "_worker_finished_event", None)
        if finished is not None:
            setter = threading.Thread(target=finished.set, name="partita-release-workers", daemon=True)
            setter.start()
            setter.join(RELEASE_WAIT)
        return close(context, *args, **kwargs)
    MultiprocessContext._close = released
    try:
        yield
    finally:
        MultiprocessContext._close = close


def _flush() -> None:
    """Both standard streams flushed: before a fork (a child would write the buffered text again) and before an
    exit that skips the interpreter's own flush."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
