"""launch.bench: discovery, one-line errors, and every benchmark's smoke run, whose report must be
complete and self-consistent. No timing thresholds: the numbers depend on the machine and its
load, so only their consistency is checked (each figure is its two numbers' ratio, each number
is the one in the details, the sizes are the smoke sizes)."""

import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from core.errors import ConfigError
from launch import bench

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def positive(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


# ------------------------------------------------------------------ per-benchmark details


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


def check_selective_rotary(d: dict) -> None:
    s = d["seconds"]
    assert set(s) == {"rope_fwd", "selective_fwd", "rope_fwd_bwd", "selective_fwd_bwd"}
    assert all(positive(v) for v in s.values())
    assert d["sizes"] == {"B": 1, "T": 16, "H": 2, "K": 8, "dtype": "float32"}
    # q, k read and written (4 x B T H K float32) plus phi read (B T H K/2 float32).
    assert d["selective_fwd_min_bytes"] == 4 * (1 * 16 * 2 * 8) * 4 + (1 * 16 * 2 * 4) * 4


def check_selective_rope(d: dict) -> None:
    assert d["sizes"] == {"B": 2, "T": 8}
    assert set(d["seconds_per_step"]) == {"gla", "transformer"}
    for s in d["seconds_per_step"].values():
        assert positive(s["rope"]) and positive(s["selective"])


def check_binned_encoding(d: dict) -> None:
    for impl in ("xla", "tiled", "interpret"):
        for name in ("fwd", "fwd_bwd"):
            assert positive(d[f"{impl}_{name}_seconds"])
    assert d["features_bytes"] == 16 * 16 * 20 * 4  # N x M float32 at the smoke size


def check_nab(d: dict) -> None:
    rates = d["train"]
    assert set(rates) == {"smoke/nab", "smoke/nab-xla", "smoke/rff"}
    assert all(positive(r["steps_per_second"]) and r["image"] == 16 for r in rates.values())


def check_poly_probe(d: dict) -> None:
    assert (d["B"], d["N"]) == (64, 3)
    assert [(r["D"], r["R"]) for r in d["shapes"]] == [(16, 2), (16, 4)]
    for r in d["shapes"]:
        s = r["seconds"]
        assert set(s) == {"op", "one_matmul", "order_by_order", "per_truncation", "matmul"}
        assert all(positive(v) for v in s.values())
        assert r["C"] == 1 + 2 * r["R"] and r["flops"] == 2 * 64 * 16 * r["C"]
        assert r["examples_per_second"] == {name: 64 / v for name, v in s.items()}
        # What each variant computes: the same Y, from 2, N (one per order) and N (N + 1) / 2
        # matmuls (the per-truncation recompute is not merged away by XLA's CSE); the op at
        # these ranks (< PER_ORDER_MIN_RANK) takes the one-matmul form.
        assert r["hlo_dots"] == {
            "op": 2,
            "one_matmul": 2,
            "order_by_order": 3,
            "per_truncation": 6,
            "matmul": 1,
        }
        # float32 sums of the same products in another order: ~1e-6 relative rounding.
        assert max(r["max_abs_diff_vs_op"].values()) <= 1e-5 * max(1.0, r["max_abs_op"])


def check_tpc(d: dict) -> None:
    from methods.tpc import cascade, model

    (c,) = d["cascade"]
    N, B = c["N"], c["rows"]
    counts_N = model.param_counts(c["D"], N, c["R"])
    assert c["full_params"] == counts_N[-1] and len(c["test_f1_by_order"]) == N
    assert [r["tau"] for r in c["taus"]] == [0.6, 0.9]
    for r in c["taus"]:
        fractions = np.array(r["exit_fraction"])
        assert len(fractions) == N and abs(fractions.sum() - 1) < 1e-9  # float64 sum of N
        assert r["mean_params"] == pytest.approx(float(counts_N @ fractions))
        assert r["cost_fraction"] == r["mean_params"] / counts_N[-1]
        assert 0 < r["cost_fraction"] <= 1 and 0 < r["work_fraction_padded"] <= 1
        assert r["mean_exit_order"] == pytest.approx(float(np.arange(1, N + 1) @ fractions))
        # Stage k sees the rows that have not exited before k, padded up to a bucket.
        remaining = [B - round(B * fractions[: k - 1].sum()) for k in range(1, N + 1)]
        assert r["stage_rows"] == remaining
        assert r["stage_bucket_rows"][0] == B
        for n, computed in zip(r["stage_rows"][1:], r["stage_bucket_rows"][1:], strict=True):
            assert computed == (cascade.bucket(n, B) if n else 0) and computed >= n
        assert r["full_seconds"] == c["full_seconds"] > 0 and r["cascade_seconds"] > 0
        assert r["time_ratio_cascade_over_full"] == r["cascade_seconds"] / r["full_seconds"]


def check_deql(d: dict) -> None:
    assert [r["n"] for r in d["rows"]] == [40, 80]
    for r in d["rows"]:
        assert all(positive(r[k]) for k in ("jax_seconds", "numpy_seconds", "numpy_over_jax"))
        # Both float64 from the same Cholesky-based formula: rounding of an 80 x 80 solve.
        assert r["max_abs_diff"] <= 1e-9 * r["max_abs_w"]
    assert all(math.isfinite(v) for v in d["fits"].values())


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


def check_csnn(d: dict) -> None:
    from methods.csnn import bench as csnn_bench

    rows = d["rows"]
    assert [r["target_edges"] for r in rows] == [500, 2000]
    for r in rows:
        n, edges = csnn_bench.graph(r["target_edges"])
        assert (r["nodes"], r["edges"]) == (n, len(edges.senders_E)) == (n, len(edges.receivers_E))
        numbers = [k for k in r if k.endswith(("_seconds", "_edges_per_s")) or "_over_" in k]
        assert len(numbers) == 12 and all(positive(r[k]) for k in numbers), r


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


def check_hybrid_online(d: dict) -> None:
    assert d["T"] == 60 and d["sizes"] == [50, 100, 200]
    # the jitted learner and the NumPy reference play the same rounds: same oracle calls and
    # predictions (float64, different summation orders)
    assert d["oracle_calls"] == d["numpy_oracle_calls"]
    assert d["max_prediction_difference"] < 1e-9
    for per_round, per_call, calls in zip(
        d["seconds_per_round"], d["seconds_per_call"], d["calls_per_round"], strict=True
    ):
        assert per_call == pytest.approx(per_round / calls)


CHECKS = {
    "lm": check_lm,
    "hybrid_online": check_hybrid_online,
    "selective_rope": check_selective_rope,
    "nab": check_nab,
    "tpc": check_tpc,
    "deql": check_deql,
    "rlcr": check_rlcr,
    "csnn": check_csnn,
    "soft_thinking": check_soft_thinking,
    "kernels/selective_rotary": check_selective_rotary,
    "kernels/binned_encoding": check_binned_encoding,
    "kernels/poly_probe": check_poly_probe,
}


# ------------------------------------------------------------------ the entry point


@pytest.mark.parametrize("name", bench.select(None, None))
def test_smoke_run_writes_a_consistent_report(name, tmp_path):
    record = bench.run([name], str(tmp_path), smoke=True)
    json_path, md_path, *figures = record["files"]
    with open(json_path) as f:
        written = json.load(f)
    assert written["smoke"] is True and written["machine"]["backend"] == jax.default_backend()
    (entry,) = written["benches"].values()
    assert list(written["benches"]) == [name] and entry["ratios"]
    for r in entry["ratios"]:
        assert positive(float(r["a"])) and positive(float(r["b"])), r
        assert r["ratio"] == r["a"] / r["b"]
    with open(md_path) as f:
        table = f.read()
    rows = [line for line in table.splitlines() if line.startswith(f"| {name} |")]
    assert len(rows) == len(entry["ratios"])
    for line, r in zip(rows, entry["ratios"], strict=True):
        assert line.split(" | ")[1] == r["figure"] and line.endswith(f" | {r['ratio']:.3g} |")
    for path in figures:
        assert os.path.getsize(path) > 1000  # a rendered PNG, not an empty file
    CHECKS.get(name, lambda d: None)(entry["details"])
    if name == "kernels/selective_rotary":
        # Each figure is the selective op's time over RoPE's, from the details' seconds.
        s = entry["details"]["seconds"]
        assert [(r["a"], r["b"]) for r in entry["ratios"]] == [
            (s["selective_fwd"], s["rope_fwd"]),
            (s["selective_fwd_bwd"], s["rope_fwd_bwd"]),
        ]


def test_lm_bench_on_every_device():
    from methods.lm import bench as lm_bench

    result = lm_bench.measure(smoke=True, devices=jax.device_count())
    check_lm(result.details, num_devices=jax.device_count())


def test_selection_discovers_methods_and_kernels():
    everything = bench.select(None, None)
    assert {"lm", "nab", "kernels/selective_rotary", "kernels/poly_probe"} <= set(everything)
    assert set(bench.method_benches()) <= set(everything)
    assert bench.select(["nab"], ["binned_encoding"]) == ["nab", "kernels/binned_encoding"]
    assert bench.select(None, ["poly_probe"]) == ["kernels/poly_probe"]
    assert bench.select(["deql", "lm", "deql"], None) == ["deql", "lm"]


@pytest.mark.parametrize(
    "methods, kernels, field",
    [(["nab", "nope"], None, "--methods"), (None, ["lm"], "--kernels"), ([], [], "")],
)
def test_unknown_or_no_names_are_one_line_errors(methods, kernels, field):
    with pytest.raises(ConfigError) as e:
        bench.select(methods, kernels)
    message = str(e.value)
    assert "\n" not in message and field in message
    if methods:
        assert "nope" in message and ", ".join(bench.method_benches()) in message
    elif kernels:
        assert "lm" in message and ", ".join(bench.kernel_benches()) in message


def test_command_line(tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"}
    command = [sys.executable, "-m", "launch.bench", f"--out={tmp_path}"]
    proc = subprocess.run(
        [*command, "--methods=deql", "--smoke"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| deql | DEQL(L2) solve, float64, n=40 |" in proc.stdout
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".json", ".md", ".png"]
    proc = subprocess.run(
        [*command, "--methods=nope"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"error: --methods: no benchmark for nope; available: {', '.join(bench.method_benches())}"
    ]
