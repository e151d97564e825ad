"""Two islands over an emulated slow link (issue 42, item 5): what each sync mode sends across the link and how
long that takes, measured against the planner's prediction.

The link: two network namespaces joined by a veth pair, with addresses (10.231.N.1 and .2) that exist only inside
them; each end's egress is shaped by a token bucket (tc tbf) to RATE Mbit/s. No latency is added: this machine's
kernel has no netem qdisc (`tc qdisc add ... netem` is refused), so the cluster is priced with 0 ms (a veth's own is
tens of microseconds). Each namespace gets its own host name (unshare --uts) and an /etc/netns/<ns>/hosts that
names both islands (`ip netns exec` binds it over /etc/hosts), so torchrun's store address and gloo's pairs resolve
to each island's own address.

One node per island, one CPU rank each: `partita run --nnodes 2`, the rendezvous on island a, tiny-gpt under a
dp = 2 DDP plan that the planner makes for `2x1xcpu@<RATE>Mbps,0ms` with the mode fixed. Per mode:
- bytes per step: island a's veth tx bytes over a LONG-step run minus those over a SHORT-step run, divided by the
  difference (start-up, the rendezvous and the report's extra traced step cancel out), against the prediction:
  what one island sends per all-reduce (`predicted.sync.cross_island_bytes`) x all-reduces per step;
- link seconds per step: the mean step time over steps 5..LONG of the shaped run minus that of the same run with
  the shaping taken off, against `predicted.sync.cross_island_s`.

    python -m benchmarks.islands [--rate-mbit 100]   # as root; writes benchmarks/results/islands.json

Where the machine does not allow it (not root, no `ip` or `tc`, namespaces or tbf refused) it says why in one line
and writes nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import write

ROOT = Path(__file__).resolve().parents[1]
LONG, SHORT, WINDOW_FROM = 24, 8, 5
"""Steps of the two runs per mode (multiples of every mode's H below), and the first step of the timed window:
steps 5..24 hold exactly 1/4 of DiLoCo's H = 4 outer steps and of streaming's H = 8, F = 2 fragment sends."""
MODES = {"synchronous": {}, "compressed": {},
         "powersgd": {"options": {"start": 2}},  # compressing from the third step (the steady state is priced)
         "diloco": {"sync_every": 4},
         "diloco, 4 bits": {"mode": "diloco", "sync_every": 4, "sync_bits": 4},
         "streaming": {"sync_every": 8, "sync_fragments": 2, "sync_delay": 1}}
GLOBAL_BATCH = 8


def unavailable() -> str | None:
    """Why this machine cannot run the benchmark (one line), or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces and tc)"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"needs the {tool!r} command"
    probe = f"ptprobe{os.getpid() % 100000}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode:
        return f"network namespaces are not allowed here: {made.stderr.strip()}"
    try:
        shaped = subprocess.run(["ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate",
                                 "100mbit", "burst", "64kb", "latency", "1s"], capture_output=True, text=True)
        if shaped.returncode:
            return f"tc's token bucket (tbf) is refused here: {shaped.stderr.strip()}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _run(*cmd: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done.stdout


class Link:
    """Two islands (namespaces a and b) joined by a veth pair; `shape(rate)` / `shape(None)` sets or takes off the
    token bucket on both ends."""

    def __init__(self):
        tag = os.getpid() % 100000
        self.ns = {"a": f"pt{tag}a", "b": f"pt{tag}b"}
        self.dev = {"a": f"pt{tag}va", "b": f"pt{tag}vb"}
        net = f"10.231.{tag % 250 + 1}"
        self.addr = {"a": f"{net}.1", "b": f"{net}.2"}
        self.host = {"a": "partita-island-a", "b": "partita-island-b"}

    def __enter__(self) -> Link:
        try:
            for side in "ab":
                _run("ip", "netns", "add", self.ns[side])
                hosts = Path("/etc/netns") / self.ns[side]
                hosts.mkdir(parents=True, exist_ok=True)
                (hosts / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
                    f"{self.addr[s]} {self.host[s]}\n" for s in "ab"))
            _run("ip", "link", "add", self.dev["a"], "type", "veth", "peer", "name", self.dev["b"])
            for side in "ab":
                _run("ip", "link", "set", self.dev[side], "netns", self.ns[side])
                _run("ip", "-n", self.ns[side], "addr", "add", f"{self.addr[side]}/24", "dev", self.dev[side])
                _run("ip", "-n", self.ns[side], "link", "set", self.dev[side], "up")
                _run("ip", "-n", self.ns[side], "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for side in "ab":
            self.kill_all(side)  # a namespace lives on while a process runs in it
            subprocess.run(["ip", "netns", "del", self.ns[side]], capture_output=True)  # takes its veth end along
            shutil.rmtree(Path("/etc/netns") / self.ns[side], ignore_errors=True)
        subprocess.run(["ip", "link", "del", self.dev["a"]], capture_output=True)  # made, but never moved in

    def kill_all(self, side: str) -> None:
        """Every process in island `side` (the launchers start their workers in sessions of their own)."""
        pids = subprocess.run(["ip", "netns", "pids", self.ns[side]], capture_output=True, text=True).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)

    def shape(self, rate_mbit: float | None) -> None:
        for side in "ab":
            cmd = ["ip", "netns", "exec", self.ns[side], "tc", "qdisc"]
            if rate_mbit is None:
                subprocess.run([*cmd, "del", "dev", self.dev[side], "root"], capture_output=True)
            else:
                _run(*cmd, "replace", "dev", self.dev[side], "root", "tbf", "rate", f"{rate_mbit}mbit", "burst", "64kb",
                     "latency", "1s")

    def tx_bytes(self, side: str) -> int:
        return int(_run("ip", "netns", "exec", self.ns[side], "cat", f"/sys/class/net/{self.dev[side]}/statistics/tx_bytes"))

    def command(self, side: str, *argv: str) -> list[str]:
        """`argv` run inside island `side`, under its own host name."""
        return ["ip", "netns", "exec", self.ns[side], "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                self.host[side], *argv]


def two_nodes(link: Link, plan: Path, steps: int, port: int, tmp: Path, timeout: float = 300) -> dict:
    """One `partita run` per island; rank 0's --losses-out, and island a's tx bytes over the run."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    before, procs = link.tx_bytes("a"), []
    for i, side in enumerate("ab"):
        argv = [sys.executable, "-m", "partita.cli", "run", str(plan), "--model", "tiny-gpt", "--steps", str(steps),
                "--nnodes", "2", "--rdzv-endpoint", f"{link.addr['a']}:{port}", "--rdzv-id", f"islands-{port}",
                "--rdzv-timeout", "60", "--log-every", "0", "--losses-out", str(tmp / f"node{i}.json")]
        with open(tmp / f"node{i}.log", "w") as log:  # a file, not a pipe: nothing blocks on a full buffer
            procs.append(subprocess.Popen(link.command(side, *argv), cwd=ROOT, env=env, stdout=log,
                                          stderr=subprocess.STDOUT))
    try:
        for p in procs:
            p.wait(timeout=timeout)
    finally:
        if any(p.poll() is None for p in procs):
            for side in "ab":
                link.kill_all(side)
            for p in procs:
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError("a node failed: " + " | ".join((tmp / f"node{i}.log").read_text()[-800:] for i in range(2)))
    reports = [json.loads(f.read_text()) for f in sorted(tmp.glob("node*.json"))]
    for f in tmp.glob("node*.json"):
        f.unlink()
    report = next(r for r in reports if r.get("step_times_s"))
    return {"tx_bytes": link.tx_bytes("a") - before, "step_times_s": report["step_times_s"]}


def plan_for(mode: str, rate_mbit: float, path: Path) -> dict:
    from partita.planner.api import plan
    from partita.planner.enumerate.space import TrainConfig
    """The plan of MODES' entry `mode` (a row's name; its sync mode is `mode` unless the entry names one)."""
    name = MODES[mode].get("mode", mode)
    fixed = {k: v for k, v in MODES[mode].items() if k not in ("options", "mode")}
    p = plan("tiny-gpt", cluster=f"2x1xcpu@{rate_mbit:g}Mbps,0ms", train=TrainConfig(global_batch=GLOBAL_BATCH),
             dp=2, tp=1, pp=1, zero=0, sync=name, **fixed).to_dict()
    if "options" in MODES[mode]:
        p.setdefault("sync", {"mode": name}).setdefault("options", {}).update(MODES[mode]["options"])
    path.write_text(json.dumps(p))
    return p


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(rate_mbit: float, modes=tuple(MODES), timing: bool = True) -> dict:
    """Each mode's bytes per step and (with `timing`) link seconds per step, measured and predicted."""
    out: dict = {}
    with Link() as link, tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for mode in modes:
            path = tmp / f"{mode}.json"
            p = plan_for(mode, rate_mbit, path)
            s = p["predicted"]["sync"]
            per_step = s.get("fragments", 1) / s.get("every", 1)  # all-reduces per step
            link.shape(rate_mbit)
            t0 = time.perf_counter()
            long, short = (two_nodes(link, path, n, _free_port(), tmp) for n in (LONG, SHORT))
            measured_bytes = (long["tx_bytes"] - short["tx_bytes"]) / (LONG - SHORT)
            predicted_bytes = s["cross_island_bytes"] * per_step
            r = out[mode] = {"sync": p.get("sync", {"mode": mode}), "parameters": p["model"]["parameters"],
                             "predicted_bytes_per_step": predicted_bytes,
                             "measured_bytes_per_step": measured_bytes,
                             "bytes_error": measured_bytes / predicted_bytes - 1,
                             "predicted_link_s_per_step": s["cross_island_s"]}
            line = (f"{mode:>12}: {measured_bytes / 1e3:8.1f} kB/step sent (predicted {predicted_bytes / 1e3:8.1f}, "
                    f"{100 * r['bytes_error']:+.1f}%)")
            if timing:
                link.shape(None)
                free = two_nodes(link, path, LONG, _free_port(), tmp)
                window = slice(WINDOW_FROM - 1, LONG)
                shaped_s = sum(long["step_times_s"][window]) / (LONG - WINDOW_FROM + 1)
                free_s = sum(free["step_times_s"][window]) / (LONG - WINDOW_FROM + 1)
                r.update(measured_link_s_per_step=shaped_s - free_s, shaped_step_s=shaped_s, unshaped_step_s=free_s,
                         shaped_step_times_s=long["step_times_s"], unshaped_step_times_s=free["step_times_s"],
                         link_time_error=(shaped_s - free_s) / s["cross_island_s"] - 1 if s["cross_island_s"] else None)
                line += (f"; link {1e3 * (shaped_s - free_s):7.2f} ms/step (predicted "
                         f"{1e3 * s['cross_island_s']:7.2f})")
            r["wall_s"] = time.perf_counter() - t0
            print(line, flush=True)
    return {"rate_mbit": rate_mbit, "latency_ms": 0, "steps": [SHORT, LONG], "window": [WINDOW_FROM, LONG],
            "global_batch": GLOBAL_BATCH, "model": "tiny-gpt", "modes": out,
            "command": f"python -m benchmarks.islands --rate-mbit {rate_mbit:g}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate-mbit", type=float, default=100.0, help="the link's rate per direction, Mbit/s")
    args = ap.parse_args(argv)
    if why := unavailable():
        print(f"benchmarks.islands: skipped: {why}")
        return 0
    result = measure(args.rate_mbit)
    print(f"wrote {write('islands', result)}")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
