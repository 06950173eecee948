"""methods/videozoomer/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    d = entry["details"]
    r = d["rollout"]
    # 2 videos x group 2; the jitted and the turn-by-turn rollouts drew the same transcript.
    assert r["rows"] == 4 and 0 < r["policy_tokens"] < r["tokens"]
    assert 1 <= r["mean_rounds"] <= 5
    for key in ("jit_seconds", "python_loop_seconds", "jit_tokens_per_s", "jit_over_python_loop"):
        assert positive(r[key]), key
    split = d["grpo_step"]
    assert all(positive(split[k]) for k in ("rollout_seconds", "update_seconds", "step_seconds"))
    assert 0 < split["rollout_fraction"] < 1 and 0 < split["update_fraction"] < 1
