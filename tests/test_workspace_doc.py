"""WORKSPACE.md's complete Method examples run as written and learns what it says; PAPERS.md,
the status table and methods/ agree; the repository needs nothing outside itself."""

import ast
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
    gradient, closed_form, no_training, host_hook, data_free, two_networks = (
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
    # 100 steps of size 0.1 on 64 unit-variance draws: the stationary error is ~0.03 per
    # coordinate (~0.05 in norm) against 2.45 at the start; 0.2 fails a mean that did not move.
    assert data_free["result"].history[-1]["eval/fit/distance"] < 0.2
    evals = [r for r in two_networks["result"].history if "eval/small/mse" in r]
    assert [r["step"] for r in evals] == [50, 100, 150, 200]
    assert [sorted(r) for r in evals][-1] == ["eval/large/mse", "eval/small/mse", "step"]
    assert "eval/large/mse" not in evals[0]  # the large split's stream runs at the end only
    # The product of the two networks fits w_true: from ~4 at step 50 to ~0.004 at step 200;
    # 0.1 fails an alternation that trains one network only (or neither).
    assert evals[-1]["eval/large/mse"] < 0.1 < evals[0]["eval/small/mse"]


def _papers() -> dict[int, str]:
    """PAPERS.md's table as {number: slug}."""
    text = (ROOT / "PAPERS.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `(\w+)` \|", text, flags=re.M)
    return {int(number): slug for number, slug in rows}


def test_papers_lists_nineteen_papers_with_a_title_claim_and_link():
    text = (ROOT / "PAPERS.md").read_text()
    rows = [r for r in text.splitlines() if re.match(r"^\| \d+ \| `", r)]
    papers = _papers()
    assert sorted(papers) == list(range(1, 20)), sorted(papers)
    assert len(set(papers.values())) == 19  # no slug listed twice
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 5, row  # #, slug, paper, claim, link
        _, slug, title, claim, link = cells
        assert title and claim.endswith("."), row
        urls = re.findall(r"\]\((\S+?)\)", link)
        paper_url = r"https://(arxiv\.org/abs/\d{4}\.\d{5}|openreview\.net/forum\?id=\w+)"
        assert urls and all(re.fullmatch(paper_url, url) for url in urls), row


def test_status_table_has_every_paper_under_its_number():
    status = (ROOT / "WORKSPACE.md").read_text().split("## Status", 1)[1]
    listed = dict(re.findall(r"^\| (\d+) \| `(\w+)`", status, flags=re.M))
    for number, slug in _papers().items():
        assert listed.get(str(number)) == slug, (number, slug, listed.get(str(number)))


def test_every_method_package_is_a_paper_or_the_baseline():
    packages = {p.parent.name for p in (ROOT / "methods").glob("*/__init__.py")}
    assert packages - set(_papers().values()) == {"lm"}


def test_methods_do_not_import_each_other():
    """Code two methods share belongs in core/ (e.g. core/tasks.py), not in one of them."""
    packages = {p.parent.name for p in (ROOT / "methods").glob("*/__init__.py")}
    crossing = []
    for path in sorted((ROOT / "methods").glob("*/**/*.py")):
        own = path.relative_to(ROOT / "methods").parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "methods" and len(parts) > 1 and parts[1] in packages - {own}:
                    crossing.append(f"{path.relative_to(ROOT)}: {name}")
    assert not crossing, crossing


def test_docs_and_code_do_not_need_a_directory_outside_the_repository():
    """A clone stands alone: nothing points at notes kept outside the repository."""
    suffixes = {".md", ".py", ".ipynb", ".toml", ".sh", ".sbatch"}
    # The tracked trees only: a user's workdirs or a virtualenv inside the clone are not ours.
    paths = [*ROOT.glob("*.*"), *ROOT.glob(".ci/*")]
    for tree in ("core", "methods", "configs", "launch", "tests"):
        paths += (ROOT / tree).rglob("*")
    offenders = []
    for path in paths:
        if not path.is_file() or (path.suffix not in suffixes and path.parent.name != ".ci"):
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            # a path into the shared folder beside the clone, its notes by name or as a
            # possessive (a reader of the clone has no such notes: say whose choice it is)
            if re.search(r"\.\./(\.\./)*shared/|NOTES-[abc]\b|\b[Nn]otes'", line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}")
    assert not offenders, offenders
