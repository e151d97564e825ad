"""Long-lived gloo ranks for the end-to-end tests that check numbers (issue 44, item 6).

A `partita run` launch costs seconds before its first step (a pre-flight process, torchrun's agent and W
workers, each importing torch), and the numerical tests launch hundreds. Here a few worker processes start
once per test session, import torch and the runtime once, and then each runs job after job: for a job of W
ranks, workers 0..W-1 join a fresh default process group (gloo, env://, a new port per job) and call the
worker's own entry point, `partita.runtime.train.main(argv)`, exactly as a torchrun worker does -- the same
argument parsing, plan checks, training loop, verification and report -- then leave the group. These are
real processes and real collectives; what only the launcher does (signals, restarts, rendezvous, the agent's
one-line errors) is still tested through `partita run` itself.

Between jobs a worker destroys its process group, collects garbage (FSDP's reference cycles), resets
torch.compile's caches and restores its environment and working directory. What is alive then is frozen
(`gc.freeze`), as after the worker's own imports: each full collection walked the
300,000 objects of torch and the loaded modules, 0.2 CPU-seconds, at least twice a rank per job (train.main's end,
and here) -- measured in session 74 (2026-12-02): a 2-rank tiny-gpt job went from 0.8 to 0.3 s, and nine
--verify jobs from 23.3 to 14.4 CPU-seconds of the pool's workers. A job that does not finish in
its time limit, or a worker that dies, restarts the whole pool and fails that test; the failure names how the
worker ended, and a worker that dies of a signal (a native crash: glibc's abort on a corrupted heap) first
writes every thread's Python stack to the test's standard error (faulthandler).

The one native crash seen (stop 67's CI, 2026-12-01: a worker died of glibc's "double free or corruption" in
the expert-parallel clipping test) is not explained: that test passed 560 runs in a row alone in one pool, so what
broke it was left by an earlier job of that worker. Ending the workers of every failed job (so that no job inherits
what a failed one left) was tried and taken back: with fresh workers beside reused ones, a 4-rank FSDP job
(tests/e2e/test_pipeline_tied_and_own_loss.py, --verify) hung in two CI runs of two, two ranks waiting for a job
while the other two waited for them in verify's collectives; the pool as it was has run the suite in CI for many
stops with that one crash. A job past its time limit says what its finished ranks printed, beside every rank's stack.
"""
from __future__ import annotations

import contextlib
import io
import multiprocessing
import os
import runpy
import socket
import sys
import time
import traceback
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass


@dataclass
class Finished:
    """A job's end, as a torchrun launch would show it: the first non-zero exit code of its ranks (rank
    order), rank 0's standard output, and every rank's standard error (rank 0's first)."""

    returncode: int
    stdout: str
    stderr: str


def _ended(proc, job: list) -> str:
    """How pool worker `proc`, which gave no result, ended, for the test's failure. Where it still runs, every
    worker of its job still running first writes its threads' stacks to the test's standard error (faulthandler,
    on SIGUSR1): where each rank waited."""
    import signal
    proc.join(timeout=1)
    if proc.exitcode is None:
        for other in job:
            if other.is_alive():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(other.pid, signal.SIGUSR1)
        time.sleep(2)
        return "did not finish in its time limit (the ranks' stacks above, from faulthandler)"
    if proc.exitcode < 0:
        return f"lost its worker to {signal.Signals(-proc.exitcode).name} (stacks above, from faulthandler)"
    return f"lost its worker, which exited with code {proc.exitcode}"


def _finished_others(workers: list, stuck: int) -> str:
    """What the ranks of a job that did finish returned, while rank `stuck` did not: their exit codes and the end
    of their standard error (a rank that failed alone leaves its peers waiting in a collective)."""
    said = []
    for r, (_, conn) in enumerate(workers):
        with contextlib.suppress(EOFError, OSError):
            if r != stuck and conn.poll(0):
                code, _, err = conn.recv()
                said.append(f"\n--- rank {r} finished with exit code {code}; its stderr ends:\n{err[-2000:]}")
    return "".join(said)


def _exit_code(e: SystemExit) -> int:
    return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)


def _between_jobs() -> None:
    import gc

    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()
    gc.collect()
    if "torch._dynamo" in sys.modules:
        sys.modules["torch._dynamo"].reset()
    gc.freeze()  # what outlived the job (modules it imported, their caches): out of the next jobs' collections


def serve(conn) -> None:
    """A pool worker: run (env, argv, cwd) jobs until it receives None."""
    import faulthandler
    import signal
    faulthandler.enable(all_threads=True)  # a native crash shows where every thread was (module docstring)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # and a job past its time limit (`_ended`)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    torch.set_num_threads(1)
    from partita.runtime.loop import session  # noqa: F401 -- imported once, for every job
    from partita.runtime import train
    import gc
    gc.freeze()  # collections skip the imports' objects (module docstring)
    home = os.getcwd()
    while True:
        job = conn.recv()
        if job is None:
            return
        env, argv, cwd, script = job
        saved, saved_argv = dict(os.environ), sys.argv
        out, err = io.StringIO(), io.StringIO()
        try:
            os.environ.update(env)
            os.chdir(cwd)
            with redirect_stdout(out), redirect_stderr(err):
                try:
                    if script is None:
                        code = train.main(argv)
                    else:  # a test's own worker script, as `torchrun SCRIPT ARGV` runs it
                        sys.argv = [script, *argv]
                        runpy.run_path(script, run_name="__main__")
                        code = 0
                except SystemExit as e:
                    code = _exit_code(e)
                except BaseException:  # noqa: BLE001 -- reported as a launch would: a traceback, exit 1
                    traceback.print_exc()
                    code = 1
        finally:
            try:
                _between_jobs()
            finally:
                os.environ.clear()
                os.environ.update(saved)
                os.chdir(home)
                sys.argv = saved_argv
        conn.send((code, out.getvalue(), err.getvalue()))


PORTS = (20000, 32000)
"""Where the tests take the ports their rendezvous stores listen on: below Linux's ephemeral range (32768-60999).
A port the kernel handed out (bind to port 0) and that was closed again is free for the kernel to hand out once
more -- as the local port of any outgoing connection, and a suite makes thousands (gloo's pairs, store clients) --
before the rank meant to listen on it binds: that rank then failed, or a peer joined another job's store and waited
out the job's 300 s."""


def free_port() -> int:
    """A port in PORTS that nothing listens on now, chosen at random (the suite's processes choose apart)."""
    import random
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(*PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {PORTS}")


class RankPool:
    """`size` long-lived worker processes; `run` hands a job to the first W of them."""

    def __init__(self, size: int = 8):
        self.size = size
        self.workers: list = []

    def _grow(self, n: int) -> None:
        """Start workers until there are `n` (they start on first need: most jobs take 1-2 ranks)."""
        ctx = multiprocessing.get_context("spawn")
        while len(self.workers) < n:
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=serve, args=(theirs,), daemon=True)
            proc.start()
            theirs.close()
            self.workers.append((proc, mine))

    def close(self) -> None:
        for proc, conn in self.workers:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for proc, _ in self.workers:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.kill()
        self.workers = []

    def _restart(self) -> None:
        for proc, _ in self.workers:
            proc.kill()
            proc.join()
        self.workers = []

    def run(self, ranks: int, argv: list, cwd, env: dict | None = None, timeout: float = 300,
            script: str | None = None, rank_argv: dict | None = None, rank_env: dict | None = None) -> Finished:
        """`partita.runtime.train.main(argv)` on `ranks` ranks, in `cwd`, with `env` added to the environment;
        with `script`, that file run as __main__ with `argv` (a test's own worker, which must leave the
        runtime as it found it: a script that patches it belongs under torchrun); `rank_argv` {rank: argv}
        and `rank_env` {rank: variables} give single ranks their own (as the nodes of a multi-node job are
        each started by their own command)."""
        if not 1 <= ranks <= self.size:
            raise ValueError(f"the pool has {self.size} workers; a job of {ranks} ranks does not fit")
        self._grow(ranks)
        port = str(free_port())
        for r in range(ranks):
            job_env = {"RANK": str(r), "LOCAL_RANK": str(r), "GROUP_RANK": "0", "WORLD_SIZE": str(ranks),
                       "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                       **(env or {}), **(rank_env or {}).get(r, {})}
            self.workers[r][1].send((job_env, [str(a) for a in (rank_argv or {}).get(r, argv)], str(cwd),
                                     script and str(script)))
        deadline, results = time.monotonic() + timeout, []
        for r in range(ranks):
            conn = self.workers[r][1]
            try:
                ready = conn.poll(max(0.0, deadline - time.monotonic()))
                results.append(conn.recv() if ready else None)
            except (EOFError, OSError):
                results.append(None)
            if results[-1] is None:
                how = _ended(self.workers[r][0], [proc for proc, _ in self.workers[:ranks]])
                said = _finished_others(self.workers[:ranks], r)
                self._restart()
                raise RuntimeError(f"rank {r} of a {ranks}-rank job {how}: pool restarted; argv {argv}{said}")
        codes = [code for code, _, _ in results]
        return Finished(returncode=next((c for c in codes if c), 0), stdout=results[0][1],
                        stderr="".join(err for _, _, err in results))


_SHARED: RankPool | None = None


def shared() -> RankPool:
    """The test session's pool (tests/conftest.py closes it at the end of the session)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = RankPool()
    return _SHARED


def close_shared() -> None:
    global _SHARED
    if _SHARED is not None:
        _SHARED.close()
        _SHARED = None


def cli(*args: str, cwd) -> Finished:
    """partita's CLI (partita.cli.main) in this process, in `cwd`: `plan`, `explain`, `export` ... without a
    process launch (a `run` is not for here: `run_plan` runs a plan's ranks)."""
    from partita.cli import main
    home, out, err = os.getcwd(), io.StringIO(), io.StringIO()
    try:
        os.chdir(cwd)
        with redirect_stdout(out), redirect_stderr(err):
            try:
                code = main(list(args))
            except SystemExit as e:
                code = _exit_code(e)
    finally:
        os.chdir(home)
    return Finished(code, out.getvalue(), err.getvalue())


def run_plan(plan_file, model: str, *flags: str, cwd, env: dict | None = None, ranks: int | None = None) -> Finished:
    """What `partita run PLAN --model MODEL FLAGS` runs on each rank, on the pool: the plan's world size of
    ranks unless `ranks` says otherwise."""
    if ranks is None:
        from partita.planner.plan import Plan
        ranks = Plan.load(plan_file).mesh.world_size
    return shared().run(ranks, [str(plan_file), "--model", model, *flags], cwd=cwd, env=env)
