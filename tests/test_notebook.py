"""launch/notebooks/quickstart.ipynb runs top to bottom in a fresh kernel and trains.

The kernel is this interpreter (a kernelspec written to a temp dir whose argv is
`sys.executable`), so the test never picks up another Python from a user's Jupyter setup, and
Jupyter's runtime and IPython dirs are temp dirs too, so nothing is written under $HOME.
"""

import json
import os
import re
import sys

import nbformat
import pytest

nbclient = pytest.importorskip("nbclient")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "launch", "notebooks", "quickstart.ipynb")
KERNEL = "iclr26-test-python"


@pytest.fixture
def kernel_name(tmp_path, monkeypatch):
    spec_dir = tmp_path / "jupyter" / "kernels" / KERNEL
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "test python",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    return KERNEL


def _text(cell) -> str:
    parts = []
    for out in cell.get("outputs", []):
        parts.append(out.get("text", ""))
        parts.append(out.get("data", {}).get("text/plain", ""))
    return "".join(parts)


def test_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_quickstart_runs_and_the_loss_goes_down(kernel_name):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name=kernel_name, resources={"metadata": {"path": REPO}}
    )
    client.execute()  # raises CellExecutionError, with the traceback, if any cell fails

    outputs = [_text(c) for c in nb.cells if c.cell_type == "code"]
    match = re.search(r"loss first -> last: ([\d.]+) -> ([\d.]+)", outputs[-1])
    assert match, outputs[-1]
    first, last = map(float, match.groups())
    assert last < first
    # The loss plot rendered without a display.
    assert any("image/png" in out.get("data", {}) for c in nb.cells for out in c.get("outputs", []))
