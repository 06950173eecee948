"""core.results (results files, code version) and core.cache (runs keyed by config and code)."""

import ast
import json
import os

import pytest
from ml_collections import ConfigDict

from core import cache, results
from core.errors import ConfigError


def test_code_version_names_the_commit_and_hashes_core_and_the_method():
    code = results.code_version("lm")
    assert code["git_commit"] is None or len(code["git_commit"]) == 40
    assert code["git_dirty"] in (None, True, False)
    files = results.source_files("lm")
    assert "core/results.py" in files and "methods/lm/experiment.py" in files
    assert "configs/lm.py" in files and not any(f.startswith("methods/csnn") for f in files)
    assert code["source_hash"] == results.source_hash(files) and code["source_files"] == len(files)


def test_run_sources_leave_out_the_files_that_only_read_numbers():
    files = results.run_sources("csnn")
    assert "methods/csnn/model.py" in files and "core/train.py" in files
    assert "configs/csnn.py" in files and "configs/common.py" in files
    left_out = set(results.source_files("csnn")) - set(files)
    assert left_out == {
        "methods/csnn/experiment.py",
        "methods/csnn/report.py",
        "methods/csnn/bench.py",
        *results.CORE_READERS,
    }


def test_no_core_module_in_a_run_key_imports_a_core_reader():
    # A reader left out of the code key must not reach a run through a module that is in it:
    # then editing it could change numbers that the cache would still serve.
    readers = {p.removesuffix(".py").replace("/", ".") for p in results.CORE_READERS}
    assert all(os.path.exists(os.path.join(results.REPO, p)) for p in results.CORE_READERS)
    for path in set(results.source_files()) - set(results.CORE_READERS):
        with open(os.path.join(results.REPO, path)) as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                names = {a.name for a in node.names}
            else:
                continue
            assert not names & readers, f"{path} imports {sorted(names & readers)}"


def test_source_hash_changes_with_content_and_names(tmp_path):
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "a.py").write_text("x = 1\n")
    before = results.source_hash(["core/a.py"], repo=str(tmp_path))
    (tmp_path / "core" / "a.py").write_text("x = 2\n")
    assert results.source_hash(["core/a.py"], repo=str(tmp_path)) != before
    (tmp_path / "core" / "a.py").write_text("x = 1\n")
    assert results.source_hash(["core/a.py"], repo=str(tmp_path)) == before
    os.rename(tmp_path / "core" / "a.py", tmp_path / "core" / "b.py")
    assert results.source_hash(["core/b.py"], repo=str(tmp_path)) != before


def test_results_file_round_trip(tmp_path):
    rows = [{"task": "copy", "seed": s, "exact_match": 0.9 + 0.01 * s} for s in range(3)]
    record = results.record("lm", "quick", config={"seeds": [0, 1, 2]}, rows=rows, extra=1)
    path = results.save(record, root=str(tmp_path))
    assert path == str(tmp_path / "lm" / "quick.json")
    back = results.load("lm", "quick", root=str(tmp_path))
    assert back == json.loads(json.dumps(record)) and back["extra"] == 1
    # Seeds stay integers in rows (JSON object keys would have made them strings).
    assert results.by_seed(back["rows"], "exact_match", task="copy") == {0: 0.9, 1: 0.91, 2: 0.92}
    assert results.path("lm", "full").endswith(
        os.path.join("methods", "lm", "results", "full.json")
    )
    with pytest.raises(ConfigError, match="no results file"):
        results.load("lm", "nothing", root=str(tmp_path))
    with pytest.raises(ConfigError, match="plain file name"):
        results.path("lm", "../x")


def test_by_seed_refuses_two_rows_for_one_seed():
    rows = [{"seed": 0, "v": 1.0}, {"seed": 0, "v": 2.0}]
    with pytest.raises(ConfigError, match="two rows with seed=0"):
        results.by_seed(rows, "v")


def test_cache_reuses_a_run_only_for_the_same_config_and_code(tmp_path):
    calls = []

    def compute(value):
        calls.append(value)
        return {"rows": [value]}

    config = ConfigDict({"seed": 0, "train": {"steps": 10}})
    root = str(tmp_path)
    assert cache.cached(lambda: compute(1), config=config, code="abc", root=root) == {"rows": [1]}
    assert cache.cached(lambda: compute(2), config=config, code="abc", root=root) == {"rows": [1]}
    assert calls == [1]
    config.train.steps = 11  # another config: recomputed, stored beside the first
    assert cache.cached(lambda: compute(3), config=config, code="abc", root=root) == {"rows": [3]}
    assert cache.cached(lambda: compute(4), config=config, code="abd", root=root) == {"rows": [4]}
    assert calls == [1, 3, 4] and len(cache.entries(root)) == 3
    assert not [f for f in os.listdir(root) if f.endswith(".tmp")]


def test_cache_recomputes_on_another_runtime(tmp_path, monkeypatch):
    config, root = {"seed": 0}, str(tmp_path)
    assert cache.cached(lambda: 1, config=config, code="c", root=root) == 1
    assert cache.cached(lambda: 2, config=config, code="c", root=root) == 1
    # The same config and code on another device count sums in another order: not a hit.
    here = cache.environment()
    other = here.rsplit(" x", 1)[0] + " x3"
    monkeypatch.setattr(cache, "environment", lambda: other)
    assert cache.cached(lambda: 3, config=config, code="c", root=root) == 3
    assert {e["environment"] for e in cache.entries(root)} == {here, other}


def test_cached_run_trains_in_a_run_dir_of_its_key_once(tmp_path):
    config = ConfigDict({"train": {"steps": 3}, "lr": 0.1})
    dirs = []

    def train_and_evaluate(cfg, run_dir):
        dirs.append(run_dir)
        return {"steps": cfg.train.steps}

    for _ in range(2):
        out = cache.cached_run(train_and_evaluate, config, "code", str(tmp_path), "a run")
        assert out == {"steps": 3}
    assert dirs == [os.path.join(tmp_path, "runs", cache.key(config, "code"))]  # trained once
    assert len(cache.entries(os.path.join(tmp_path, "cache"))) == 1


def test_cache_does_not_trust_an_entry_whose_config_differs(tmp_path):
    # Same file name (as after a hash collision or a hand edit) but another config inside.
    config, root = {"seed": 0}, str(tmp_path)
    cache.cached(lambda: 1, config=config, code="c", root=root)
    path = os.path.join(root, f"{cache.key(config, 'c')}.json")
    with open(path) as f:
        entry = json.load(f)
    entry["config"] = cache.canonical({"seed": 1})
    with open(path, "w") as f:
        json.dump(entry, f)
    assert cache.cached(lambda: 2, config=config, code="c", root=root) == 2
