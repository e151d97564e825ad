"""runtime.launcher.fork.released_on_stop: torchrun's agent stopping forked workers that have already returned
(a stop signal, a restart, an elastic round) lets them exit instead of waiting out its close timeout and
SIGKILLing them. Before it, Ctrl-C to a 2-rank tiny `partita run` ended 30 s after the workers' stop line.

The workers here return at once and then ignore SIGTERM, so what ends them is either the release (exit code 0)
or the close timeout's SIGKILL (-9): the outcome, not a duration, tells the two apart. Run in a fresh
interpreter: forking the test process (xdist's threads) is not what the launcher does."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, signal, sys, tempfile, time
from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes
from partita.runtime.launcher.fork import released_on_stop

def returns_deaf():
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # only the release or SIGKILL can end it now
    return 0

def exit_codes(release):
    context = start_processes("probe", returns_deaf, {0: (), 1: ()}, {0: {}, 1: {}},
                              DefaultLogsSpecs(log_dir=tempfile.mkdtemp()), start_method="fork")
    deadline = time.monotonic() + 60
    while not all(not q.empty() for q in context._ret_vals.values()):  # both returned, waiting to be read
        assert time.monotonic() < deadline and all(p.is_alive() for p in context._pc.processes), "never returned"
        time.sleep(0.05)
    if release:  # a generous close timeout: the released workers end it as soon as they exit
        with released_on_stop():
            context.close(signal.SIGTERM, timeout=30)
    else:  # nothing ends these but the timeout's SIGKILL
        context.close(signal.SIGTERM, timeout=2)
    return sorted(p.exitcode for p in context._pc.processes)

print(json.dumps({"released": exit_codes(True), "torch's own": exit_codes(False)}))
"""


def test_workers_that_returned_exit_when_the_agent_stops_them():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    codes = json.loads(out.stdout.splitlines()[-1])
    assert codes == {"released": [0, 0], "torch's own": [-9, -9]}
