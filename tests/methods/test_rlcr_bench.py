"""methods/rlcr/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_rlcr(entry["details"])


def check_rlcr(d: dict) -> None:
    decode = d["decode"]
    assert [(r["new_tokens"], r["eos"]) for r in decode] == [(3, "none"), (6, "EOS")]
    for r in decode:
        for key in ("jit_seconds", "python_loop_seconds", "jit_tokens_per_s",
                    "python_loop_tokens_per_s", "jit_over_python_loop"):  # fmt: skip
            assert positive(r[key]), key
    # 4 prompts x group 4, no eos: every row generates all 3 tokens, by both decoders.
    assert decode[0]["jit_tokens"] == decode[0]["python_loop_tokens"] == 16 * 3
    split = d["grpo_step"]
    assert all(positive(split[k]) for k in ("rollout_seconds", "update_seconds", "step_seconds"))
    assert 0 < split["rollout_fraction"] < 1 and 0 < split["update_fraction"] < 1
