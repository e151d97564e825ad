"""The product's size limits (issue 43), checked so they hold without anyone counting: no folder holds more than
MAX_ENTRIES entries (group by concern instead), no module is longer than MAX_LINES lines, and no function longer
than MAX_FUNCTION_LINES (name its steps instead). The product is costmodel/, planner/, runtime/ and the front
door in partita/ (whose costmodel/planner/runtime entries are links to the three)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = [ROOT / "costmodel", ROOT / "planner", ROOT / "runtime", ROOT / "partita"]
MAX_ENTRIES = 15
MAX_LINES = 500
MAX_FUNCTION_LINES = 60


def _folders():
    for top in PRODUCT:
        yield top
        for path in sorted(top.rglob("*")):
            if path.is_dir() and not path.is_symlink() and path.name != "__pycache__" \
                    and not any(p.is_symlink() for p in path.parents if p.is_relative_to(ROOT)):
                yield path


def _modules():
    for folder in _folders():
        yield from sorted(p for p in folder.glob("*.py") if not p.is_symlink())


def _entries(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name != "__pycache__" and not p.name.startswith("."))


def test_no_folder_holds_more_than_fifteen_entries():
    crowded = {str(f.relative_to(ROOT)): len(_entries(f)) for f in _folders() if len(_entries(f)) > MAX_ENTRIES}
    assert not crowded, f"group these folders' modules by concern (at most {MAX_ENTRIES} entries): {crowded}"


def test_no_module_is_longer_than_five_hundred_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these modules (at most {MAX_LINES} lines): {long}"


def test_no_function_is_longer_than_sixty_lines():
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert not long, f"name these functions' steps (at most {MAX_FUNCTION_LINES} lines each): {long}"


def test_the_walk_sees_the_whole_product():
    """The checks above would pass on an empty walk: they must see every layer's modules, once each."""
    modules = list(_modules())
    assert {"costmodel", "planner", "runtime", "partita"} <= {p.relative_to(ROOT).parts[0] for p in modules}
    assert len({p.resolve() for p in modules}) == len(modules) > 150  # no file twice through partita/'s links
    assert not any(p.parts[:2] in {("partita", "costmodel"), ("partita", "planner"), ("partita", "runtime")}
                   for p in (m.relative_to(ROOT) for m in _modules()))
