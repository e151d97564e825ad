"""Every notebook in notebooks/ runs top to bottom in a fresh kernel, so none can rot.

The kernel is this interpreter (a kernel spec written to a temporary directory, nothing installed
globally), with the working directory notebooks/. A cell error fails the test with the cell's traceback.
"""
from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

from jupyter_client.kernelspec import KernelSpecManager  # noqa: E402  (after the skips)

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SLOW: set[str] = set()  # notebooks over ~20 s; plan_and_run_tiny (one torchrun launch) takes ~12 s on 2 cores
TIMEOUT_S = 300         # per cell; each notebook aims for under a minute in all


def kernel_manager_for_this_python(tmp_dir: Path):
    """A kernel manager whose kernel is `sys.executable -m ipykernel_launcher` (no global kernel spec)."""
    from ipykernel.kernelspec import write_kernel_spec
    from jupyter_client.manager import KernelManager

    write_kernel_spec(str(tmp_dir / "partita-test"))
    ksm = KernelSpecManager(kernel_dirs=[str(tmp_dir)])
    return KernelManager(kernel_name="partita-test", kernel_spec_manager=ksm)


def run_notebook(path: Path, tmp_dir: Path, cwd: Path | None = None) -> "nbformat.NotebookNode":
    """Execute a notebook in a fresh kernel with working directory `cwd` (default: the notebook's folder)."""
    nb = nbformat.read(path, as_version=4)
    km = kernel_manager_for_this_python(tmp_dir)
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT_S, km=km,
                                     resources={"metadata": {"path": str(cwd or path.parent)}})
    try:
        client.execute()
    finally:  # a kernel manager handed in is not shut down by nbclient: its kernel outlived the test (~500 MiB)
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    return nb


def _params():
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        marks = [pytest.mark.slow] if path.name in SLOW else []
        yield pytest.param(path, id=path.stem, marks=marks)


def test_notebooks_exist():
    names = {p.name for p in NOTEBOOKS.glob("*.ipynb")}
    assert {"explore_gpt.ipynb", "explore_llama.ipynb", "plan_and_run_tiny.ipynb"} <= names


@pytest.mark.parametrize("path", list(_params()))
def test_notebook_runs(path: Path, tmp_path: Path):
    nb = run_notebook(path, tmp_path)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors  # execute() raises CellExecutionError first; this guards allow_errors changes


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_notebook_stored_without_outputs(path: Path):
    """Notebooks are committed clean: the tests execute them, so outputs would only add stale images."""
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert not cell.get("outputs") and cell.get("execution_count") is None, \
                f"{path.name} has stored outputs: clear them (jupyter nbconvert --clear-output --inplace)"
