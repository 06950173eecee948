"""The notebooks in launch/notebooks run top to bottom in a fresh kernel, train, and can have
their training cell run again (it continues training from the session's current state).

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
NOTEBOOK_DIR = os.path.join(REPO, "launch", "notebooks")
NOTEBOOKS = ("quickstart.ipynb", "csnn_by_hand.ipynb")
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


def _training_cell(nb) -> int:
    """The index of the one code cell that trains (calls `session.train`)."""
    found = [
        i for i, c in enumerate(nb.cells) if c.cell_type == "code" and "session.train(" in c.source
    ]
    assert len(found) == 1, found
    return found[0]


def _steps_and_losses(text: str) -> tuple[list[int], list[float]]:
    """The (step, loss) pairs a training cell printed, e.g. "step  50  loss 0.1234"."""
    pairs = re.findall(r"step\s+(\d+)\s+(?:train )?loss ([\d.]+)", text)
    assert pairs, text
    return [int(s) for s, _ in pairs], [float(v) for _, v in pairs]


def _run_then_rerun_training(path: str, kernel_name: str):
    """Executes every cell in order, then the training cell once more in the same kernel.
    Returns the executed notebook and the training cell's printed output of both runs."""
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=180, kernel_name=kernel_name, resources={"metadata": {"path": REPO}}
    )
    train = _training_cell(nb)
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)  # raises CellExecutionError, with the traceback
        first = _text(nb.cells[train])
        client.execute_cell(nb.cells[train], train)
        second = _text(nb.cells[train])
    return nb, first, second


def _check_rerun_continues(first: str, second: str, steps_per_run: int):
    first_steps, first_losses = _steps_and_losses(first)
    second_steps, second_losses = _steps_and_losses(second)
    assert (first_steps[0], first_steps[-1]) == (1, steps_per_run)
    # The second run starts from the state the first one left (not from step 0, nor from a
    # donated buffer, which would raise)...
    assert (second_steps[0], second_steps[-1]) == (steps_per_run + 1, 2 * steps_per_run)
    # ...so it starts at the trained loss, not at the initial one.
    assert second_losses[0] < 0.5 * first_losses[0], (first_losses, second_losses)


def _has_figure(nb) -> bool:
    return any("image/png" in out.get("data", {}) for c in nb.cells for out in c.get("outputs", []))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_without_outputs(name):
    nb = nbformat.read(os.path.join(NOTEBOOK_DIR, name), as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)


def test_quickstart_runs_the_loss_goes_down_and_training_can_be_rerun(
    kernel_name, tmp_path, monkeypatch
):
    # The pretrained-LM cell reads this tiny checkpoint instead of fetching and running
    # SmolLM2 (98 MB); tests/test_generate.py's slow test runs the real one.
    from tests.test_generate import write_tiny_llama

    write_tiny_llama(tmp_path / "tiny-llama")
    monkeypatch.setenv("ICLR26_QUICKSTART_MODEL", str(tmp_path / "tiny-llama"))
    monkeypatch.setenv("ICLR26_PRETRAINED_DIR", str(tmp_path / "pretrained"))
    nb, first, second = _run_then_rerun_training(
        os.path.join(NOTEBOOK_DIR, "quickstart.ipynb"), kernel_name
    )
    outputs = [_text(c) for c in nb.cells if c.cell_type == "code"]
    (generated,) = [out for out in outputs if "decode: " in out]
    prefill = re.search(r"prefill: (\d+) tokens, [\d.]+ tokens/s", generated)
    assert prefill and int(prefill[1]) > 10, generated  # the chat template's prompt went in
    assert re.search(r"decode: \d+ tokens, [\d.]+ tokens/s", generated), generated
    match = re.search(r"loss first -> last: ([\d.]+) -> ([\d.]+)", outputs[-1])
    assert match, outputs[-1]
    first_loss, last_loss = map(float, match.groups())
    assert last_loss < first_loss
    assert _has_figure(nb)  # the loss plot rendered without a display
    _check_rerun_continues(first, second, steps_per_run=200)


def test_csnn_notebook_runs_learns_and_training_can_be_rerun(kernel_name):
    nb, first, second = _run_then_rerun_training(
        os.path.join(NOTEBOOK_DIR, "csnn_by_hand.ipynb"), kernel_name
    )
    summary = _text([c for c in nb.cells if c.cell_type == "code"][-1])
    losses = re.search(r"train loss first -> last: ([\d.]+) -> ([\d.]+)", summary)
    auroc = re.search(r"test AUROC ([\d.]+)", summary)
    assert losses and auroc, summary
    assert float(losses[2]) < float(losses[1])
    # Chance is 0.5; the trained model's mine scores rank clearly better (a learned-something
    # check on 100 test cells, not a rounding tolerance).
    assert float(auroc[1]) > 0.6
    assert _has_figure(nb)
    _check_rerun_continues(first, second, steps_per_run=60)
