"""The layering of DESIGN.md holds (issue 43, step 6): import-linter's contracts (pyproject.toml
[tool.importlinter]: the front door above the runtime above the planner above the costmodel; the runtime reads
only the planner's plan contract, which imports nothing else of the planner), and no import inside a function
closes a cycle between modules -- except a package's own __init__ importing one of its submodules on demand
(a dispatcher such as costmodel.capture.capture or costmodel.hardware.parse_cluster, where it belongs)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = {"costmodel": "partita.costmodel", "planner": "partita.planner", "runtime": "partita.runtime",
           "partita": "partita"}


def test_import_contracts_are_kept():
    pytest.importorskip("importlinter")
    run = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0 and "BROKEN" not in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]


def modules(folders: dict[str, str], root: Path) -> dict[str, Path]:
    """Module name -> file, for the packages under `root` (the links in partita/ are the layers themselves)."""
    found = {}
    for folder, prefix in folders.items():
        for f in (root / folder).rglob("*.py"):
            parts = list(f.relative_to(root / folder).with_suffix("").parts)
            if folder == "partita" and parts[0] in folders:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = f
    return found


def _imports(tree: ast.AST, known: dict, name: str) -> tuple[set[str], set[str]]:
    """(module-level imports, imports inside functions) of one module, as known module names. Imports under
    `if TYPE_CHECKING:` are not run and count as neither."""
    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    top, inner = set(), set()

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, True)
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            names = []
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                names = [child.module, *(f"{child.module}.{a.name}" for a in child.names)]
            for n in names:
                r = resolve(n) if n.split(".")[0] == name.split(".")[0] else None
                if r and r != name:
                    (inner if in_function else top).add(r)
            visit(child, in_function)
    visit(tree, False)
    return top, inner


def cycles_closed_in_functions(known: dict[str, Path]) -> list[str]:
    """Each import inside a function of module A of a module B from which A is reached again by module-level
    imports (importing a module imports its parent packages too), but not a package importing its own
    submodule."""
    top, inner = {}, {}
    for name, f in known.items():
        top[name], inner[name] = _imports(ast.parse(f.read_text()), known, name)

    def reaches(a: str, b: str) -> bool:
        seen, todo = set(), [a]
        while todo:
            x = todo.pop()
            if x == b:
                return True
            if x not in seen:
                seen.add(x)
                parent = x.rpartition(".")[0]
                todo += [*top.get(x, ()), *([parent] if parent in known else [])]
        return False
    return sorted(f"{a} imports {b} inside a function, and {b} imports {a}" for a, bs in inner.items() for b in bs
                  if not b.startswith(a + ".") and reaches(b, a))


def test_no_import_inside_a_function_closes_a_cycle():
    assert cycles_closed_in_functions(modules(FOLDERS, ROOT)) == []


def test_the_cycle_check_sees_a_cycle(tmp_path):
    pkg = tmp_path / "demo"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("import demo.b\n")
    (pkg / "b.py").write_text("def f():\n    import demo.a\n")
    (pkg / "c.py").write_text("def g():\n    from typing import TYPE_CHECKING\n")
    found = cycles_closed_in_functions(modules({"demo": "demo"}, tmp_path))
    assert found == ["demo.b imports demo.a inside a function, and demo.a imports demo.b"]
