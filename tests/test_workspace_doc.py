"""WORKSPACE.md's complete Method example runs as written and learns what it says."""

import pathlib
import re

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def protocol_examples() -> list[str]:
    text = (ROOT / "WORKSPACE.md").read_text()
    section = text.split("## The Method protocol", 1)[1].split("\n## ", 1)[0]
    return [b for b in re.findall(r"```python\n(.*?)```", section, flags=re.S) if "train.run" in b]


def run_example(block: str, tmp_path) -> dict:
    block = re.sub(r'"/tmp/[\w-]+"', lambda m: repr(str(tmp_path / m.group(0)[6:-1])), block)
    namespace: dict = {}
    exec(compile(block, "WORKSPACE.md", "exec"), namespace)
    return namespace


def test_protocol_examples_run_and_do_what_they_say(tmp_path):
    gradient, closed_form, no_training, host_hook = (
        run_example(b, tmp_path) for b in protocol_examples()
    )
    # Noise-free regression with 200 Adam steps: the weights land on [1, 2, 3, 4] up to the
    # optimiser's residual oscillation (~lr); 0.1 is a loose "it learned" check, not rounding.
    w = np.asarray(gradient["result"].state.params["w"])
    np.testing.assert_allclose(w, [1.0, 2.0, 3.0, 4.0], atol=0.1)
    # One ridge solve on 256 noisy examples (noise sd 0.1): the eval MSE is the estimation error
    # alone, ~3 * 0.1^2 / 256 ~ 1e-4; 1e-3 fails for any solve that did not fit (MSE ~ 5).
    (row,) = [r for r in closed_form["result"].history if "eval/mse" in r]
    assert row["eval/mse"] < 1e-3
    assert no_training["result"].history[0]["step"] == 0
    hits = (no_training["scores"] > 0) == (no_training["labels"] > 0)
    # Counts of 100 in float32: exact.
    assert no_training["result"].history[0]["eval/accuracy"] == hits.mean()
    branches = [r["branch"] for r in host_hook["result"].history]
    assert branches[0] == 0 and branches[-1] == 1  # the hook moved from SGD to Adam


def test_status_table_has_every_method():
    text = (ROOT / "WORKSPACE.md").read_text()
    abstracts = (ROOT.parent / "shared" / "papers" / "ABSTRACTS.md").read_text()
    slugs = re.findall(r"^\| \d+ \| `(\w+)` \|", abstracts, flags=re.M)
    assert len(slugs) == 19
    table = text.split("## Status", 1)[1]
    for slug in slugs:
        assert f"`{slug}`" in table, slug
