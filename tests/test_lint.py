"""ruff's lint over the whole tree (product, tests, benchmarks, examples): the rules in pyproject's [tool.ruff.lint].

It finds what review misses: a name used but never imported (a string annotation included), an import left
unused after a move, a variable assigned and never read. ruff is part of the test extra, so this runs in CI.
"""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_finds_nothing():
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]


def test_ruff_sees_an_undefined_name(tmp_path):
    """The check can fail: a module using a name it never defined is reported under the project's own rules."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return undefined_name\n")
    r = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
                        str(bad)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "F821" in r.stdout, r.stdout + r.stderr
