"""torchrun's elastic agent in the launcher's process (`python -m partita.runtime.train ... --nproc-per-node W`,
runtime.api.agent_main): it starts this node's workers, keeps torchrun's own log lines off the console, passes
signals on, watches the other nodes' launchers, and turns the first failure into one line and an exit code.
runtime.api re-exports `agent`."""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

from partita.costmodel import PartitaError
from partita.runtime.launcher.child import LOG_DIR_ENV, LOG_DIR_PREFIX
from partita.runtime.launcher.elastic import rescale_for
from partita.runtime.launcher.leave import after_monitor, for_job, leaving
from partita.runtime.loop.allocator import configure_allocator
from partita.runtime.loop.console import stderr_line
from partita.runtime.failure.guards import stop_line
from partita.runtime.loop.report import (KILLED_BY_AGENT, PEER_LOST, RankFailure, attempt_failures, first_failure,
                                         read_failure)
from partita.runtime.failure.stop import PROGRESS_ENV, handled, recorded_step

PROGRESS_FILE = "steps-passed.json"
"""In the launcher's directory: the step boundaries local rank 0 passed (runtime.failure.stop.record_step)."""

_TORCHRUN_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.distributed.run",
                     "torch.multiprocessing")  # the last: forked workers (runtime.launcher.fork)


class _AgentLog(logging.Filter):
    """Keeps torchrun's own log lines (worker exit codes, SIGTERMs, rendezvous chatter) off the console, where
    the launcher reports failures itself; a restart after a failure becomes one line naming the rank."""

    def __init__(self, log_dir: str, nnodes: int = 1):
        super().__init__()
        self.log_dir, self.nnodes = log_dir, nnodes
        self.died = None
        """The worker torchrun saw fail first (its "failed (exitcode: ...)" record): one that died without an
        error file (a signal, os._exit) is known only from it, or from `failed`."""
        self.failed: dict[int, tuple[int, float]] = {}
        """Every failed worker of the latest attempt, {local rank: (exit code, when)}, from the agent's own
        monitoring result (`watch_failures`). torchrun logs only the failure it deems first -- by timestamp,
        an error file's whole second against the time it polled a silent worker -- so a peer that wrote
        "connection closed" in the same second as a worker died silently (os._exit, SIGKILL) was logged in
        its place, and the dead worker's exit code was lost."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(_TORCHRUN_LOGGERS):
            return True
        if str(record.msg).startswith("failed (exitcode") and isinstance(record.args, tuple) and len(record.args) >= 2:
            self.died = (int(record.args[1]), int(record.args[0]), record.created)
        if "will restart worker group" in str(record.msg) and "attempts left" in str(record.msg):
            # torchrun logs (role, state, restarts left before this one, max restarts), then takes one
            left, most = (record.args[2], record.args[3]) if isinstance(record.args, tuple) and \
                len(record.args) == 4 else (None, None)
            which = f" (restart {most - left + 1} of {most})" if isinstance(left, int) and isinstance(most, int) else ""
            failures = attempt_failures(self.log_dir) + self._silent()
            what = first_failure(failures).line() if failures else "a worker failed"
            stderr_line(f"partita: {what}; torchrun restarts the workers{which}")
        return False

    def _silent(self) -> list:
        """The workers of the latest attempt that wrote no error file (killed, or os._exit): with the exit code
        torchrun logged when it was the first to fail. On one node only, where local ranks are the ranks."""
        attempts = sorted(Path(self.log_dir).glob("*/attempt_*"), key=lambda p: int(p.name.split("_")[-1]))
        if self.nnodes != 1 or not attempts:
            return []
        silent = [int(d.name) for d in attempts[-1].iterdir() if d.is_dir() and not (d / "error.json").exists()]
        out = []
        for local in silent:
            if local in self.failed:
                out.append(read_failure(local, self.failed[local][0], None, self.failed[local][1]))
            elif self.died is not None and self.died[0] == local:
                out.append(read_failure(local, self.died[1], None, self.died[2]))
            else:
                out.append(RankFailure(rank=local, exitcode=1, message="ended without an error message", time=time.time()))
        return out


def watch_failures(log: _AgentLog):
    """While torchrun's agent runs here: every failed worker of each attempt into `log.failed` (the result of
    LocalElasticAgent._monitor_workers, `_add_silent_deaths`). A torch without that method runs unwatched."""
    def after(agent, worker_group, result):
        failures = getattr(result, "failures", None) or {}
        if failures:
            _add_silent_deaths(agent, worker_group, failures)
            log.failed = {f.local_rank: (f.exitcode, f.timestamp) for f in failures.values()
                          if hasattr(f, "local_rank") and hasattr(f, "exitcode")}
        return result
    return after_monitor(after)


def _add_silent_deaths(agent, worker_group, failures: dict) -> None:
    """Forked workers (torch's MultiprocessContext) fail one at a time: torch's poll reports the first process its
    join finds ended and stops the rest. A killed worker (SIGKILL, writing nothing) whose peer exited on
    "connection closed by peer" before the next poll went unnamed when the join found the peer first (session 74's
    CI). Each worker that had already failed (not by torch's SIGTERM) is added with its exit code
    under its global rank (the result's keys), as SubprocessContext reports them all; first_failure picks the cause."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    context = getattr(agent, "_pcontext", None)
    processes = getattr(getattr(context, "_pc", None), "processes", None)
    error_files, workers = getattr(context, "error_files", None) or {}, getattr(worker_group, "workers", None) or []
    for local, proc in enumerate(processes or []):
        code, rank = getattr(proc, "exitcode", None), workers[local].global_rank if local < len(workers) else local
        if rank in failures or not code or -code in KILLED_BY_AGENT or local not in error_files:
            continue
        failures[rank] = ProcessFailure(local_rank=local, pid=proc.pid, exitcode=code, error_file=error_files[local])


def _report(first) -> int:
    """Print a worker's failure (or a stop it was asked for) as the one line the user sees, and the traceback
    of an unexpected exception below it; return the exit code."""
    if first.exitcode > 128:  # runtime.loop.session.Stopped: every rank stopped after the same step
        stderr_line(f"partita: {first.message}")
    else:
        stderr_line(f"partita: error: {first.line()}")
    if first.trace:
        stderr_line(f"traceback of rank {first.rank}:\n{first.trace.rstrip()}")
    return first.exitcode if first.exitcode > 0 else 1


def _name_the_cause(losses_out: str | None, first, since: float) -> None:
    """--losses-out holds rank 0's failure: when that only says a peer went away (runtime.loop.report.PEER_LOST)
    and the launcher knows which rank failed first, the file's `failure` names that rank (what rank 0 saw
    is kept as `failure_noticed`). Only a file this launcher's workers wrote (`since`: when it started)."""
    if not losses_out or first.peer_lost:
        return
    path = Path(losses_out)
    try:
        if path.stat().st_mtime < since:
            return
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    seen = data.get("failure") if isinstance(data, dict) else None
    if not isinstance(seen, str) or not PEER_LOST.search(seen):
        return
    data.update(failure=first.line(), failure_noticed=seen)
    part = path.with_name(path.name + ".part")
    try:
        part.write_text(json.dumps(data, indent=2))
        part.replace(path)
    except OSError:
        pass


def _unreported_stop(signum: int, log_dir: str) -> int:
    """A signal stopped the job but no worker said where (none had started, or torchrun killed them before
    they reached a step boundary: a worker paused, or stuck in a collective): one line from the steps local
    rank 0 recorded (runtime.failure.stop.record_step); returns 128 + the signal."""
    passed = recorded_step(Path(log_dir) / PROGRESS_FILE)
    if passed is None:
        line = f"stopped by {signal.Signals(signum).name} before the first step ended"
    else:
        line = stop_line(signum, passed["step"], passed.get("steps", "?"), passed.get("checkpoint"),
                         bool(passed.get("checkpointing")), how=" (the workers did not reach the next step "
                         "boundary in time and were killed)")
    stderr_line(f"partita: {line}")
    return 128 + signum


def _stop_on_signal(signum, frame):
    """A stop signal before torchrun's agent installs its own handlers (during the rendezvous): end it as that
    does."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))


@contextlib.contextmanager
def _stop_signals():
    """Handlers of the stop signals (runtime.failure.stop.handled; SIGINT stays KeyboardInterrupt) while the agent
    starts, and torchrun's own list of the signals it passes to the workers (the same, so a SIGHUP ignored
    under nohup stays ignored here too)."""
    signals = handled()
    os.environ["PET_SIGNALS_TO_HANDLE"] = ",".join(s.name for s in signals)  # torchrun's --signals-to-handle
    main = threading.current_thread() is threading.main_thread()
    previous = {s: signal.signal(s, _stop_on_signal) for s in signals if s != signal.SIGINT} if main else {}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _children() -> list[int]:
    """This process's child processes (torchrun's workers, in the agent's process), from /proc (Linux)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
        except OSError:
            continue
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(entry))
    return found


WORKER_GRACE = 5.0
"""Seconds the workers of a node whose peer was lost get to end on SIGTERM before SIGKILL."""


def _stop_children(grace: float = WORKER_GRACE) -> None:
    """SIGTERM this process's children (the workers stop at a step boundary if they still can), SIGKILL those
    left after `grace` seconds (stuck in a collective with a lost peer)."""
    kids = _children()
    for pid in kids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end and any(_alive(pid) for pid in kids):
        time.sleep(0.2)
    for pid in kids:
        if _alive(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether child `pid` still runs (reaped here when it has ended)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == 0


def _lost_line(line: str, log_dir: str) -> str:
    """A lost node's line, with the last step every rank of this node passed (runtime.failure.stop.record_step) and the
    newest committed checkpoint to resume from: the one recorded, or a newer one in the recorded directory (a node
    lost right after a save is committed leaves this node's ranks waiting for it before they record the save)."""
    passed = recorded_step(Path(log_dir) / PROGRESS_FILE)
    if passed is None:
        return f"{line}; this node stops (no training step had ended)"
    from partita.runtime.checkpoint import layout  # on a failure only: the package loads DCP
    newest = layout.latest(passed["root"]) if passed.get("root") else None
    resume = str(newest) if newest is not None else passed.get("checkpoint")
    where = f"; resume from {resume} with --resume" if resume else ""
    return f"{line}; this node stops after step {passed['step']} of {passed.get('steps', '?')}{where}"


def _abandon(line: str, log_dir: str) -> None:
    """End this launcher now from another thread than torchrun's (which may be blocked in a store wait that
    ignores signals): stop the workers, print `line`, remove the directory, exit 1."""
    _stop_children()
    stderr_line(f"partita: error: {line}")
    shutil.rmtree(log_dir, ignore_errors=True)
    os._exit(1)


@contextlib.contextmanager
def _watch_exit_barrier(nnodes: int):
    """While torchrun's agent runs here: a node whose workers have all ended (torchrun's exit barrier) tells its
    peers (runtime.launcher.peers.PeerWatch.mark_done), so that its end is not taken for a loss; and an agent that ends
    any other way (a signal, its workers failed for good) checks in to that barrier on its way out
    (`_check_in`). torchrun's agents leave that barrier only when every agent has arrived or after 300 s: the
    node whose launcher was killed (its agent then stops on the SIGTERM runtime.failure.stop.die_with_parent sends) never
    arrived, and its peers, whose workers had stopped with it, waited out the 300 s in silence."""
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent

    from partita.runtime.launcher import rendezvous
    barrier, invoke = SimpleElasticAgent._exit_barrier, SimpleElasticAgent._invoke_run
    seen: dict = {}

    @functools.wraps(barrier)
    def marked(agent_self):
        seen["barrier"] = True
        if rendezvous.WATCH is not None:
            rendezvous.WATCH.mark_done()
        return barrier(agent_self)

    @functools.wraps(invoke)
    def held(agent_self, *args, **kwargs):
        seen["agent"] = agent_self
        return invoke(agent_self, *args, **kwargs)
    SimpleElasticAgent._exit_barrier, SimpleElasticAgent._invoke_run = marked, held
    try:
        yield
    finally:
        SimpleElasticAgent._exit_barrier, SimpleElasticAgent._invoke_run = barrier, invoke
        if nnodes > 1 and "agent" in seen and not seen.get("barrier"):
            _check_in(seen["agent"])


CHECK_IN_WAIT = 10.0
"""Seconds an agent that ends gives its check-in to the exit barrier (a store that no longer answers)."""


def _check_in(torchrun_agent) -> None:
    """Arrive at torchrun's exit barrier without waiting in it (as SimpleElasticAgent._exit_barrier does first),
    so no other node's agent waits for this one; in a thread given CHECK_IN_WAIT s, any failure ignored."""
    def arrive():
        from torch.distributed.elastic.agent.server.api import _TERMINAL_STATE_SYNC_ID
        from torch.distributed.elastic.utils.store import _barrier_nonblocking
        group = torchrun_agent._worker_group
        _barrier_nonblocking(torchrun_agent._store, group.group_world_size, _TERMINAL_STATE_SYNC_ID)

    def guarded():
        with contextlib.suppress(Exception):
            arrive()
    t = threading.Thread(target=guarded, daemon=True)
    t.start()
    t.join(CHECK_IN_WAIT)


def _lost_instead(first, log_dir: str, nnodes: int):
    """When this node's first failure only says that a peer went away (or a worker ended without a word), and
    another node was lost: that node's line (runtime.launcher.peers.PeerWatch.verdict), else None. (A stop is reported
    as it is: the workers of a node whose launcher was killed get SIGTERM and stop the whole job at a step
    boundary, and that is what every node says.)"""
    from partita.runtime.launcher import peers, rendezvous
    if nnodes < 2 or rendezvous.WATCH is None or not (first.peer_lost or first.error_file is None):
        return None
    line = rendezvous.WATCH.verdict(peers.LOST + 2 * peers.BEAT)
    return _lost_line(line, log_dir) if line else None


def _store_lost(log_dir: str, watch) -> int:
    """torchrun's agent failed after the rendezvous: its store went away with the node that hosted it (ended, or
    killed). What this node's workers said (a stop the others asked for on their way out), else the lost node."""
    from partita.runtime.launcher.store import APART
    failures = attempt_failures(log_dir)
    first = first_failure(failures) if failures else None
    if first is not None and not first.peer_lost:
        return _report(first)
    line = watch.verdict(0) or (  # the store is gone: the watch can learn nothing more from it
        f"lost the rendezvous store at {watch.host}:{watch.port}: the node that hosts it ended or was killed; "
        + APART.format(port=watch.port))
    stderr_line(f"partita: error: {_lost_line(line, log_dir)}")
    return 1


def agent(worker_argv: list[str], nproc: int, *, nnodes: int = 1, rdzv_endpoint: str | None = None,
          rdzv_id: str | None = None, max_restarts: int = 0, rdzv_timeout: float | None = None,
          losses_out: str | None = None, rescale_every: float | None = None, hang_timeout: float | None = None) -> int:
    """Run torchrun's elastic agent for this node in this process on `python -m partita.runtime.train WORKER_ARGV`
    and return the exit code: 0, or the first failing worker's (1 if it died by a signal).

    One node: `--standalone`. Several: c10d rendezvous at `rdzv_endpoint` (the same command on every
    node), watched by runtime.launcher.rendezvous (deadline `rdzv_timeout`, progress lines, one line on failure).
    The workers write their errors into torchrun's per-worker error files (runtime.loop.report) in a log
    directory of this launcher; the first failure is printed as one line, `partita: error: rank R: ...`,
    with the traceback of an unexpected exception below it; the directory is removed. A worker that ends the
    job on purpose exits 0 with its code in its error file (runtime.train.AGENT_ENV), so that torchrun does
    not restart it, and that code is returned. SIGTERM, SIGINT, SIGHUP and SIGQUIT reach the workers through
    torchrun's agent, which passes them on; the workers stop at a step boundary (runtime.failure.stop) and their line
    is printed -- or, when torchrun had to kill them first, a line from the last step boundary they passed
    (`_unreported_stop`). The directory is the one runtime.launcher.child made (LOG_DIR_ENV) when it started this
    launcher, else a new one.

    Several nodes: the launchers watch each other (runtime.launcher.peers). A node lost outright is named by the others
    within LOST seconds of its last heartbeat (`_abandon`: their workers stopped, one line, exit 1) -- also when
    their workers only saw a connection reset (`_lost_instead`) or the store went with it (`_store_lost`); a
    node that ends any other way checks in to torchrun's exit barrier (`_watch_exit_barrier`), so its peers do
    not wait 300 s for it there."""
    import importlib
    # before _quiet_torchrun_logs: importing torchrun sets up the log handlers that its filter is attached to
    # (imported later, the restart notice and the other records went past the filter)
    importlib.import_module("torch.distributed.run")
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from partita.runtime.launcher import fork, rendezvous
    try:
        argv = _torchrun_flags(nproc, nnodes, rdzv_endpoint, rdzv_id, max_restarts, rdzv_timeout, rescale_every)
    except PartitaError as e:
        stderr_line(f"partita: error: {e}")
        return 2
    log_dir = _log_dir()
    argv += [f"--log-dir={log_dir}", "-m", "partita.runtime.train", *worker_argv]
    started = time.time()
    with _quiet_torchrun_logs(log_dir, nnodes) as quiet:
        try:
            with _stop_signals(), watch_failures(quiet), _watch_exit_barrier(nnodes), \
                    leaving(for_job(nnodes, hang_timeout, log_dir, rdzv_endpoint)):  # runtime.launcher.leave
                fork.run_torchrun(argv, worker_argv)
            return _after_attempts(log_dir, nnodes)
        except ChildFailedError as e:
            return _after_failed_children(e, log_dir, nnodes, losses_out, started)
        except (SignalException, KeyboardInterrupt) as e:
            return _after_signal(e, log_dir)
        except Exception as e:  # the agent itself: rendezvous timeout, unreachable endpoint
            return _after_agent_error(e, log_dir)
        finally:
            if rendezvous.WATCH is not None:
                rendezvous.WATCH.stop()
            rendezvous.stop_heartbeats()
            shutil.rmtree(log_dir, ignore_errors=True)


def _log_dir() -> str:
    """The launcher's log directory (the one runtime.launcher.child made, else a new one), where the workers' error
    files and progress go; the rendezvous watch's failures end in `_abandon` there."""
    from partita.runtime.launcher import rendezvous
    log_dir = os.environ.get(LOG_DIR_ENV) or tempfile.mkdtemp(prefix=LOG_DIR_PREFIX)  # runtime.launcher.child makes it
    rendezvous.FATAL = lambda line: _abandon(line, log_dir)
    rendezvous.ON_LOST = lambda line: _abandon(_lost_line(line, log_dir), log_dir)
    os.environ[PROGRESS_ENV] = str(Path(log_dir) / PROGRESS_FILE)
    return log_dir


def _after_signal(e, log_dir: str) -> int:
    """A signal stopped torchrun's agent: the workers' own line where they stopped at a step boundary and said
    where, else one from the last step boundary they passed."""
    failures = attempt_failures(log_dir)
    if failures:  # the workers stopped at a step boundary and said where
        return _report(first_failure(failures))
    return _unreported_stop(int(getattr(e, "sigval", signal.SIGINT)), log_dir)


def _after_agent_error(e: Exception, log_dir: str) -> int:
    """torchrun's agent itself failed (rendezvous timeout, unreachable endpoint; after the rendezvous: the store
    went away with the node hosting it): one line, exit 1."""
    from partita.runtime.launcher import rendezvous
    if isinstance(e, rendezvous.SpareNotNeeded):  # nothing failed: the job ended while this node waited
        stderr_line(str(e))
        return 0
    if rendezvous.WATCH is not None:  # after the rendezvous: the store went away with the node hosting it
        return _store_lost(log_dir, rendezvous.WATCH)
    line = rendezvous.failure_line(e) or f"torchrun: {type(e).__name__}: {e}".strip().splitlines()[0]
    stderr_line(f"partita: error: {line}")
    return 1


def _torchrun_flags(nproc: int, nnodes: int, rdzv_endpoint: str | None, rdzv_id: str | None, max_restarts: int,
                    rdzv_timeout: float | None, rescale_every: float | None = None) -> list[str]:
    """torchrun's flags for this node (one node: --standalone; several: c10d rendezvous registered with
    runtime.launcher.rendezvous), and the environment the workers inherit. PartitaError: an endpoint that
    cannot be used (one line)."""
    from partita.runtime.launcher import rendezvous
    from partita.runtime.train import AGENT_ENV
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    # a fresh rendezvous store per attempt (runtime.launcher.mesh._store; pytorch#135712); needed across nodes
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ[AGENT_ENV] = "1"
    configure_allocator()  # the workers inherit it (runtime.loop.allocator)
    argv = [f"--nnodes={nnodes}", f"--nproc-per-node={nproc}", f"--max-restarts={max_restarts}"]
    rendezvous.WATCH = None  # started by this agent's first rendezvous (several nodes)
    if not rdzv_endpoint:
        return argv + ["--standalone"]
    rendezvous.check_endpoint(rdzv_endpoint)
    timeout = rdzv_timeout or rendezvous.DEFAULT_TIMEOUT
    elastic = rescale_for(nnodes, rescale_every)  # runtime.launcher.elastic: a membership change re-plans the job
    return argv + [*rendezvous.register(rdzv_endpoint, timeout, elastic), f"--rdzv-id={rdzv_id or 'partita'}"]


@contextlib.contextmanager
def _quiet_torchrun_logs(log_dir: str, nnodes: int):
    """torchrun's log records filtered by `_AgentLog` (what partita says in its own lines is not repeated), the
    restart notice (an INFO record) let through; everything as it was afterwards. Yields the filter."""
    quiet = _AgentLog(log_dir, nnodes)
    handlers = [h for name in ("torch.distributed", "torch", "") for h in logging.getLogger(name).handlers]
    for h in handlers:
        h.addFilter(quiet)
    restarts_log = logging.getLogger("torch.distributed.elastic.agent.server.api")
    level = restarts_log.level
    restarts_log.setLevel(logging.INFO)
    try:
        yield quiet
    finally:
        for h in handlers:
            h.removeFilter(quiet)
        restarts_log.setLevel(level)


def _after_attempts(log_dir: str, nnodes: int) -> int:
    """torchrun ended without a failed child: 0, or the code a worker that ended the job on purpose left in its
    error file (exit 0, code in the file)."""
    failures = attempt_failures(log_dir)
    if not failures:
        return 0
    first = first_failure(failures)
    if lost := _lost_instead(first, log_dir, nnodes):
        stderr_line(f"partita: error: {lost}")
        return 1
    return _report(first)


def _after_failed_children(e, log_dir: str, nnodes: int, losses_out: str | None, started: float) -> int:
    """torchrun gave up on a failed worker (its restarts spent): the first failure, one line, also among the
    attempt's error files (the hang watch's verdict on a rank torchrun saw end before the watch's own exit)."""
    failures = [read_failure(rank, f.exitcode, f.error_file if os.path.isfile(f.error_file) else None, f.timestamp)
                for rank, f in e.failures.items()]
    first = first_failure(failures + [f for f in attempt_failures(log_dir) if f.error_file not in
                                      {g.error_file for g in failures}])
    if lost := _lost_instead(first, log_dir, nnodes):
        stderr_line(f"partita: error: {lost}")
        return 1
    _name_the_cause(losses_out, first, started)
    return _report(first)
