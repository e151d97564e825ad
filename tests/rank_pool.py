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
torch.compile's caches and restores its environment and working directory. A job that does not finish in
its time limit, or a worker that dies, restarts the whole pool and fails that test.
"""
from __future__ import annotations

import io
import multiprocessing
import os
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


def serve(conn) -> None:
    """A pool worker: run (env, argv, cwd) jobs until it receives None."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    torch.set_num_threads(1)
    from partita.runtime import session, train  # noqa: F401 -- imported once, for every job
    home = os.getcwd()
    while True:
        job = conn.recv()
        if job is None:
            return
        env, argv, cwd = job
        saved = dict(os.environ)
        out, err = io.StringIO(), io.StringIO()
        try:
            os.environ.update(env)
            os.chdir(cwd)
            with redirect_stdout(out), redirect_stderr(err):
                try:
                    code = train.main(argv)
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
        conn.send((code, out.getvalue(), err.getvalue()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
            rank_argv: dict | None = None, rank_env: dict | None = None) -> Finished:
        """`partita.runtime.train.main(argv)` on `ranks` ranks, in `cwd`, with `env` added to the environment;
        `rank_argv` {rank: argv} and `rank_env` {rank: variables} give single ranks their own (as the nodes
        of a multi-node job are each started by their own command)."""
        if not 1 <= ranks <= self.size:
            raise ValueError(f"the pool has {self.size} workers; a job of {ranks} ranks does not fit")
        self._grow(ranks)
        port = str(free_port())
        for r in range(ranks):
            job_env = {"RANK": str(r), "LOCAL_RANK": str(r), "GROUP_RANK": "0", "WORLD_SIZE": str(ranks),
                       "LOCAL_WORLD_SIZE": str(ranks), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                       **(env or {}), **(rank_env or {}).get(r, {})}
            self.workers[r][1].send((job_env, [str(a) for a in (rank_argv or {}).get(r, argv)], str(cwd)))
        deadline, results = time.monotonic() + timeout, []
        for r in range(ranks):
            conn = self.workers[r][1]
            try:
                ready = conn.poll(max(0.0, deadline - time.monotonic()))
                results.append(conn.recv() if ready else None)
            except (EOFError, OSError):
                results.append(None)
            if results[-1] is None:
                self._restart()
                raise RuntimeError(f"rank {r} of a {ranks}-rank job did not finish within {timeout:g} s (or its "
                                   f"worker died): pool restarted; argv {argv}")
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
