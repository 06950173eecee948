"""One unattended check of whatever accelerator is present, within a few minutes.

    python -m launch.device_check --out=device_check.json            # on a GPU or TPU machine
    python -m launch.device_check --smoke --out=/tmp/check.json      # anywhere (CPU: interpreted)

For a machine lent for minutes: nothing to prepare, one JSON back. In order:
  1. the machine (jax, backend, devices) and its memory bandwidth, measured by a large
     elementwise copy (what a memory-bound kernel can hope for), beside the datasheet figure
     where the device is known;
  2. every kernel (each `core/kernels/<op>/bench.py: device_case`) run natively (`impl="pallas"`:
     Mosaic on TPU, Triton on GPU; on CPU the Pallas interpreter, at the smoke size) against its
     jnp reference, forward and gradients, each within the case's tolerance; then timed against
     the reference compiled by XLA, forward and forward + backward, with the fraction of the
     measured bandwidth its forward reaches (its least traffic / time);
  3. a few training steps of every configs/<slug>.py's smoke variant (its declared `smoke`,
     `core.declarations`) on all devices (losses finite, step time after the first).
The JSON is rewritten after every item, so a run cut short keeps what it measured. Items past
`--budget_s` are skipped and listed ("complete": false). The exit status is 1 when any check
failed or any item was skipped.
"""

import importlib
import json
import math
import pathlib
import sys
import time
import traceback

import jax
import jax.numpy as jnp
import numpy as np

from core.benchmark import KernelCase, json_ready, machine, median_seconds
from launch.bench import kernel_benches

# Every core/kernels/<op>/ with a bench.py, whose `device_case` is checked: no list to keep.
KERNELS = tuple(kernel_benches())
METHOD_STEPS = 3
# Datasheet HBM bandwidth (bytes/s) by `device_kind`, for context beside the measured figure.
DATASHEET_BANDWIDTH = {
    "NVIDIA H200": 4.8e12,
    "NVIDIA H100 80GB HBM3": 3.35e12,
    "NVIDIA A100-SXM4-80GB": 2.04e12,
    "TPU v4": 1.2e12,
    "TPU v5 lite": 8.19e11,
    "TPU v5": 2.765e12,
    "TPU v6 lite": 1.64e12,
}


def on_accelerator() -> bool:
    return jax.default_backend() in ("gpu", "tpu")


def measured_bandwidth(smoke: bool) -> dict:
    """Bytes/s of `x + 1` over a large float32 array (read once, written once): the memory
    bandwidth a streaming kernel can reach on this device."""
    n = 2**16 if smoke else 2**28  # 1 GiB of float32 on an accelerator
    x = jnp.zeros((n,), jnp.float32)
    add = jax.jit(lambda x: x + 1)
    seconds = median_seconds(lambda: add(x).block_until_ready(), 3 if smoke else 10)
    kind = jax.devices()[0].device_kind
    return {
        "bytes": 2 * 4 * n,
        "seconds": seconds,
        "bytes_per_s": 2 * 4 * n / seconds,
        "datasheet_bytes_per_s": DATASHEET_BANDWIDTH.get(kind),
    }


def relative_error(got, want) -> float:
    """max |got - want| / max |want| over one array (the scale, so near-zero entries do not
    dominate)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(float(np.max(np.abs(want))), np.finfo(np.float32).tiny) if want.size else 1.0
    return float(np.max(np.abs(got - want))) / scale if want.size else 0.0


def _forward_and_vjp(case: KernelCase, impl: str):
    """Jitted forward and (forward, gradients in `case.wrt` for fixed random cotangents)."""

    def forward(*args):
        return case.fn(*args, impl=impl)

    def forward_backward(*args):
        def of_wrt(*diff):
            full = list(args)
            for i, value in zip(case.wrt, diff, strict=True):
                full[i] = value
            return forward(*full)

        out, vjp = jax.vjp(of_wrt, *(args[i] for i in case.wrt))
        leaves, treedef = jax.tree.flatten(out)
        keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
        cotangents = [
            jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves, strict=True)
        ]
        return out, vjp(treedef.unflatten(cotangents))

    return jax.jit(forward), jax.jit(forward_backward)


def check_kernel(case: KernelCase, impl: str, repeats: int, bandwidth: float | None) -> dict:
    """The native `impl` against the reference (computed at HIGHEST matmul precision, so the
    reference is float32 wherever the backend would round), then both timed."""
    native_fwd, native_both = _forward_and_vjp(case, impl)
    ref_fwd, ref_both = _forward_and_vjp(case, "xla")
    with jax.default_matmul_precision("highest"):
        want = jax.device_get(ref_both(*case.args))
    got = jax.device_get(native_both(*case.args))
    errors = {}
    for part, (g, w) in zip(("forward", "gradient"), zip(got, want, strict=True), strict=True):
        paths = jax.tree_util.tree_flatten_with_path(w)[0]
        for (path, w_leaf), g_leaf in zip(paths, jax.tree.leaves(g), strict=True):
            errors[f"{part}{jax.tree_util.keystr(path)}"] = relative_error(g_leaf, w_leaf)
    worst = max(errors.values())
    out = {
        "case": case.name,
        "impl": impl,
        "tol": case.tol,
        "max_relative_error": worst,
        "errors": errors,
        "passed": bool(worst <= case.tol),
    }
    seconds = {}
    for name, fn in (
        ("native_fwd", native_fwd),
        ("xla_fwd", ref_fwd),
        ("native_fwd_bwd", native_both),
        ("xla_fwd_bwd", ref_both),
    ):
        seconds[name] = median_seconds(lambda fn=fn: jax.block_until_ready(fn(*case.args)), repeats)
    out["seconds"] = seconds
    out["xla_over_native"] = {
        p: seconds[f"xla_{p}"] / seconds[f"native_{p}"] for p in ("fwd", "fwd_bwd")
    }
    out["native_fwd_bytes_per_s"] = case.min_bytes / seconds["native_fwd"]
    out["fraction_of_measured_bandwidth"] = (
        out["native_fwd_bytes_per_s"] / bandwidth if bandwidth else None
    )
    if impl == "interpret":
        out["note"] = "no accelerator: the kernel ran in the Pallas interpreter; times are not"
        out["note"] += " a kernel's"
    return out


def check_method(name: str, steps: int) -> dict:
    """`configs/<name>.py`'s smoke variant (its declared `smoke`, `core.declarations`) on every
    device: `steps` training steps (the first compiles; the others are timed one by one) and
    one evaluation."""
    from core import declarations, train

    entry = declarations.entry(name)
    config = entry.smoke_config()
    config.train.steps = steps
    session = train.init(config, entry.method(config))
    rows, seconds = [], []
    for _ in range(steps if session.step is not None else 0):
        start = time.perf_counter()
        rows += session.train(1)
        jax.block_until_ready(session.state)
        seconds.append(time.perf_counter() - start)
    evaluation = session.evaluate()
    losses = [row["loss"] for row in rows if "loss" in row]
    finite = all(math.isfinite(v) for v in losses)  # evaluation's NaN means "not measured"
    return {
        "devices": session.mesh.size,
        "steps": len(seconds),
        "losses": losses,
        "first_step_seconds": seconds[0] if seconds else None,
        "step_seconds": float(np.median(seconds[1:])) if len(seconds) > 1 else None,
        "evaluation": evaluation,
        "passed": finite and (session.step is None or int(session.state.step) == steps),
    }


def one_line(error: BaseException) -> str:
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def run(out: str, *, smoke: bool, budget_s: float, kernels=KERNELS, method_names=None) -> dict:
    """Every check in turn, the report rewritten to `out` after each; returns the report."""
    from core import declarations

    start = time.perf_counter()
    path = pathlib.Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    report = {"machine": machine(), "smoke": smoke, "kernels": {}, "methods": {}, "skipped": []}

    def save():
        report["seconds"] = time.perf_counter() - start
        items = [*report["kernels"].values(), *report["methods"].values()]
        report["passed"] = all(item["passed"] for item in items)
        report["complete"] = not report["skipped"]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1, default=json_ready))
        tmp.replace(path)

    def attempt(part: str, name: str, fn):
        if time.perf_counter() - start > budget_s:
            report["skipped"].append(f"{part}/{name}")
            print(f"[device_check] {part}/{name}: skipped (past --budget_s={budget_s:.0f})")
            return
        try:
            report[part][name] = fn()
        except Exception as e:  # one item's failure must not cost the others
            report[part][name] = {"passed": False, "error": one_line(e)}
            traceback.print_exc()
        item = report[part][name]
        print(
            f"[device_check] {part}/{name}: {'ok' if item['passed'] else 'FAILED'} "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
        save()

    report["bandwidth"] = measured_bandwidth(smoke)
    save()
    impl = "pallas" if on_accelerator() else "interpret"
    small = smoke or not on_accelerator()  # the interpreter runs the smoke sizes only
    repeats = 2 if small else 20
    for op in kernels:
        bench = importlib.import_module(f"core.kernels.{op}.bench")
        attempt(
            "kernels",
            op,
            lambda bench=bench: check_kernel(
                bench.device_case(smoke=small), impl, repeats, report["bandwidth"]["bytes_per_s"]
            ),
        )
    for name in method_names if method_names is not None else declarations.config_names():
        attempt("methods", name, lambda name=name: check_method(name, METHOD_STEPS))
    save()
    return report


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="device_check.json", help="the JSON report")
    parser.add_argument("--smoke", action="store_true", help="smallest sizes everywhere")
    parser.add_argument("--budget_s", type=float, default=540.0, help="skip items past this")
    parser.add_argument("--kernels", default=",".join(KERNELS), help="comma-separated")
    parser.add_argument("--methods", default=None, help="comma-separated (default: all)")
    args = parser.parse_args(argv)
    kernels = [k for k in args.kernels.split(",") if k]
    unknown = sorted(set(kernels) - set(KERNELS))
    if unknown:
        parser.error(f"--kernels: unknown {unknown}; known: {', '.join(KERNELS)}")
    from core import declarations

    known = declarations.config_names()
    names = None if args.methods is None else [m for m in args.methods.split(",") if m]
    if names is not None and sorted(set(names) - set(known)):
        parser.error(
            f"--methods: unknown {sorted(set(names) - set(known))}; known: {', '.join(known)}"
        )
    report = run(
        args.out, smoke=args.smoke, budget_s=args.budget_s, kernels=kernels, method_names=names
    )
    verdict = "passed" if report["passed"] else "FAILED"
    if not report["complete"]:
        verdict += f", {len(report['skipped'])} item(s) skipped for time"
    print(f"[device_check] {verdict}; report: {args.out}")
    return 0 if report["passed"] and report["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
