"""methods/lm/bench.py's smoke report, checked in detail.

tests/test_bench.py's smoke test runs the benchmark (`launch.bench --smoke`) and, after its
generic checks, calls `check_bench` here (found by this file's name: tests/bench_checks.py)."""

import math
import statistics

import jax
import pytest

from tests.bench_checks import positive


def check_bench(entry: dict) -> None:
    """`entry`: the benchmark's record in the report (its ratios, details and notes)."""
    check_lm(entry["details"])
    over = entry["details"]["step_over_gradient"]
    figures = {
        r["figure"].split(": ")[-1]: r
        for r in entry["ratios"]
        if "over its gradient" in r["figure"]
    }
    assert set(figures) == {
        "seconds per call",
        "process CPU seconds per call (the work, any load)",
        "XLA's FLOP count",
    }
    assert figures["seconds per call"]["a"] == over["seconds"]["train_step"]
    assert figures["seconds per call"]["b"] == over["seconds"]["gradient"]
    assert figures["XLA's FLOP count"]["ratio"] == pytest.approx(over["xla_flops_ratio"])
    check_generation(entry)


def check_generation(entry: dict) -> None:
    """The generation figures at smoke size: every run's token counts are the sizes asked for,
    each rate is its tokens over its seconds, and each figure shows the numbers of the runs it
    names (a figure reading another batch's or dtype's run would not match)."""
    gen = entry["details"]["generation"]
    (b1, bn), P, N = gen["batches"], gen["prompt_len"], gen["new_tokens"]
    assert set(gen["runs"]) == {f"ours/{d}/b{b}" for d in ("float32", "bfloat16") for b in (b1, bn)}
    for name, run in gen["runs"].items():
        batch = int(name.rsplit("/b", 1)[1])
        assert (run["prefill_tokens"], run["decode_tokens"]) == (batch * P, batch * (N - 1))
        for stage in ("prefill", "decode"):
            seconds = run[f"{stage}_s"]
            assert positive(seconds)
            assert run[f"{stage}_tokens_per_s"] == pytest.approx(run[f"{stage}_tokens"] / seconds)
    speed = [r for r in entry["ratios"] if r["figure"].startswith("generate, batch")]
    assert len(speed) == 4  # bfloat16 over float32, prefill and decode, at both batches
    for r in speed:
        batch, stage = int(r["figure"].split()[2]), r["figure"].rsplit(": ", 1)[1]
        assert r["a"] == gen["runs"][f"ours/bfloat16/b{batch}"][f"{stage}_tokens_per_s"]
        assert r["b"] == gen["runs"][f"ours/float32/b{batch}"][f"{stage}_tokens_per_s"]
    loop = gen["loop_vs_while_loop_float32_b1"]
    (timed,) = [r for r in entry["ratios"] if "lax.while_loop" in r["b_label"]]
    assert (timed["a"], timed["b"]) == (loop["python_loop"], loop["while_loop"])
    assert any("not run" in note for note in entry["notes"])  # smoke: no comparators


def check_lm(d: dict, *, num_devices: int = 1) -> None:
    step = d["train_step"]
    by_size = d["matmul"]["float32"]["by_size"].values()
    numbers = [
        d["peak_flops_per_s"],
        d["mfu"],
        step["compile_s"],
        step["seconds"],
        step["steps_per_s"],
        step["tokens_per_s"],
        step["flops_per_token"],
        step["achieved_flops_per_s"],
        step["xla_flops_per_s"],
        *(v["flops_per_s"] for v in by_size),
    ]
    assert all(positive(x) for x in numbers), numbers
    assert d["num_devices"] == num_devices
    assert d["peak_dtype"] == step["compute_dtype"] == "float32"
    assert d["peak_flops_per_s"] == max(v["flops_per_s"] for v in by_size)
    assert d["mfu"] == pytest.approx(step["achieved_flops_per_s"] / d["peak_flops_per_s"])
    assert step["steps"] == 3
    assert step["steps_per_s"] == pytest.approx(step["steps"] / step["seconds"])
    assert step["tokens_per_step"] == 8 * (2 * 8 + 2)  # batch 8 x copy length 2L + 2
    assert step["tokens_per_s"] == pytest.approx(step["steps_per_s"] * step["tokens_per_step"])
    assert step["achieved_flops_per_s"] == pytest.approx(
        step["flops_per_token"] * step["tokens_per_s"]
    )
    assert step["xla_flops_per_step"] > 0
    assert step["num_params"] > 0 and math.isfinite(step["final_loss"])
    tokens_per_device = step["tokens_per_step"] / num_devices
    check_step_over_gradient(d["step_over_gradient"], rounds=2, tokens_per_device=tokens_per_device)


def check_step_over_gradient(over: dict, *, rounds: int, tokens_per_device: float) -> None:
    """The train step timed against the loss's gradient, alternately, `rounds` rounds."""
    for by_round in (over["seconds_by_round"], over["cpu_seconds_by_round"]):
        assert set(by_round) == {"train_step", "gradient"}
        assert all(len(times) == rounds for times in by_round.values())
        assert all(positive(t) for times in by_round.values() for t in times)
    for name, times in over["seconds_by_round"].items():
        assert over["seconds"][name] == statistics.median(times)
    # XLA's FLOPs of the whole step over the gradient's alone, on one device's share. The
    # optimiser on every device costs at most 25 FLOPs per parameter (XLA counts 21: clipping's
    # norm, AdamW), the gradient at least 6 per parameter per token on the device. A second
    # pass over the model (a metric's own forward pass, recomputation) would add a third of
    # the gradient's FLOPs: half of that is the margin.
    optimiser = 25 / (6 * tokens_per_device)
    assert 1.0 <= over["xla_flops_ratio"] < 1 + optimiser + 1 / 6


def test_lm_bench_on_every_device():
    from methods.lm import bench as lm_bench

    result = lm_bench.measure(smoke=True, devices=jax.device_count(), generation=False)
    check_lm(result.details, num_devices=jax.device_count())
