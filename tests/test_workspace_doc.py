"""WORKSPACE.md's complete Method example runs as written and learns what it says."""

import pathlib
import re

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_protocol_example_runs(tmp_path):
    text = (ROOT / "WORKSPACE.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "def make(config) -> Method" in b)
    example = example.replace('"/tmp/linear-regression"', repr(str(tmp_path)))
    namespace: dict = {}
    exec(compile(example, "WORKSPACE.md", "exec"), namespace)
    w = np.asarray(namespace["result"].state.params["w"])
    # Noise-free regression with 200 Adam steps: the weights land on [1, 2, 3, 4] up to the
    # optimiser's residual oscillation (~lr); 0.1 is a loose "it learned" check, not rounding.
    np.testing.assert_allclose(w, [1.0, 2.0, 3.0, 4.0], atol=0.1)


def test_status_table_has_every_method():
    text = (ROOT / "WORKSPACE.md").read_text()
    abstracts = (ROOT.parent / "shared" / "papers" / "ABSTRACTS.md").read_text()
    slugs = re.findall(r"^\| \d+ \| `(\w+)` \|", abstracts, flags=re.M)
    assert len(slugs) == 19
    table = text.split("## Status", 1)[1]
    for slug in slugs:
        assert f"`{slug}`" in table, slug
