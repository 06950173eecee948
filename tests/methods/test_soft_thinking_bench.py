"""methods/soft_thinking/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

import pytest

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_soft_thinking(entry["details"])


def check_soft_thinking(d: dict) -> None:
    kinds = {"sample", "soft", "dirichlet", "gumbel", "core_sampler", "soft_python_loop"}
    assert set(d["seconds"]) == set(d["tokens_per_s"]) == kinds
    assert all(positive(v) for v in d["seconds"].values())
    setup = d["setup"]
    assert (setup["rows"], setup["prompt_len"], setup["new_tokens"]) == (4, 4, 4)
    # No eos, no delimiter: every row generates all N tokens; tokens/s is B N over seconds.
    assert d["tokens"] == d["soft_generated_tokens"] == 4 * 4
    for name, s in d["seconds"].items():
        assert d["tokens_per_s"][name] == pytest.approx(d["tokens"] / s)
    # The Python loop draws with generate's keys: the same tokens.
    assert d["python_loop_same_tokens"] is True
