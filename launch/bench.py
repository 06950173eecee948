"""Run the benchmarks: one table of ratios measured side by side, and a JSON with every number.

    python -m launch.bench                                   # every benchmark (tens of minutes)
    python -m launch.bench --methods=lm,nab                  # these methods' benchmarks only
    python -m launch.bench --kernels=selective_rotary        # a kernel's, op against reference
    python -m launch.bench --methods=nab --kernels=binned_encoding --smoke --out=/tmp/bench

Found the way `launch.reproduce` finds experiments, with no registry: a method has a benchmark
when `methods/<slug>/bench.py` exists, a kernel when `core/kernels/<op>/bench.py` does; each is
`measure(*, smoke=False) -> core.benchmark.Result`. `--methods` and `--kernels` pick among them
(with neither, all run; with one, only what it names); in the outputs a kernel's benchmark is
named `kernels/<op>`. `--smoke`: tiny sizes, seconds each (what the tests run; the figures then
say nothing about speed). Writes `<out>/<UTC time>.json` (the machine, then per benchmark its
ratios, every raw number and notes) and `<out>/<UTC time>.md` (the table), and, for a benchmark
that defines `plot(result, path)`, `<out>/<UTC time>_<name>.png`.
"""

import datetime
import importlib
import importlib.util
import json
import os
import pkgutil
import sys
import time

from absl import app, flags, logging


def define_flags() -> None:
    """The command line's flags, defined only when run as a program: `launch.reproduce` also
    has a --methods flag, and tests import both modules into one process."""
    flags.DEFINE_list("methods", None, "Methods whose benchmark runs (methods/<slug>).")
    flags.DEFINE_list("kernels", None, "Kernels whose benchmark runs (core/kernels/<op>).")
    flags.DEFINE_string("out", "results/bench", "Folder for the JSON and markdown reports.")
    flags.DEFINE_bool("smoke", False, "Tiny sizes: checks that each benchmark runs.")


KERNEL_PREFIX = "kernels/"


def _has_bench(package: str) -> bool:
    return importlib.util.find_spec(f"{package}.bench") is not None


def method_benches() -> list[str]:
    import methods

    return [m for m in methods.available() if _has_bench(f"methods.{m}")]


def kernel_benches() -> list[str]:
    import core.kernels

    ops = sorted(m.name for m in pkgutil.iter_modules(core.kernels.__path__) if m.ispkg)
    return [op for op in ops if _has_bench(f"core.kernels.{op}")]


def select(method_names: list[str] | None, kernel_names: list[str] | None) -> list[str]:
    """The benchmarks to run, as output names (`<slug>`, `kernels/<op>`): everything when
    neither list is given, otherwise what the lists name. An unknown name is a ConfigError."""
    from core.errors import ConfigError

    if method_names is None and kernel_names is None:
        return method_benches() + [KERNEL_PREFIX + op for op in kernel_benches()]
    names = []
    for flag, given, known, prefix in (
        ("methods", method_names or [], method_benches(), ""),
        ("kernels", kernel_names or [], kernel_benches(), KERNEL_PREFIX),
    ):
        unknown = [n for n in given if n not in known]
        if unknown:
            raise ConfigError(
                f"--{flag}: no benchmark for {', '.join(unknown)}; available: {', '.join(known)}"
            )
        names += [prefix + n for n in dict.fromkeys(given)]  # each once, in the order given
    if not names:
        raise ConfigError("--methods and --kernels name no benchmark; leave both out to run all")
    return names


def _module(name: str):
    if name.startswith(KERNEL_PREFIX):
        return importlib.import_module(f"core.kernels.{name[len(KERNEL_PREFIX) :]}.bench")
    return importlib.import_module(f"methods.{name}.bench")


def run(names: list[str], out: str, *, smoke: bool = False, modules=None) -> dict:
    """Runs the named benchmarks one after the other; writes and returns the JSON record (with
    the paths written under "files"). `modules` maps a name to its benchmark module (anything
    with `measure(*, smoke)` and optionally `plot(result, path)`) for a benchmark that is not a
    package's bench.py: a method a test defines runs through the same report."""
    from core import benchmark, storage

    storage.require_local(out, what="--out")
    start = benchmark.machine()
    stem = os.path.join(out, datetime.datetime.now(datetime.UTC).strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    results, record = {}, {"machine": start, "smoke": smoke, "benches": {}}
    files = []
    for name in names:
        module = (modules or {}).get(name) or _module(name)
        load_before, clock = benchmark.load_avg_1m(), time.perf_counter()
        result = module.measure(smoke=smoke)
        seconds = time.perf_counter() - clock
        print(f"{name}: {len(result.ratios)} figures in {seconds:.1f} s", flush=True)
        results[name] = result
        record["benches"][name] = {
            "wall_seconds": seconds,
            "load_avg_1m": {"before": load_before, "after": benchmark.load_avg_1m()},
            "ratios": [r.to_dict() for r in result.ratios],
            "details": result.details,
            "notes": result.notes,
        }
        if hasattr(module, "plot"):
            path = f"{stem}_{name.replace('/', '_')}.png"
            module.plot(result, path)
            files.append(path)
    record["load_avg_1m_after"] = benchmark.load_avg_1m()
    table = benchmark.markdown(results, start, record["load_avg_1m_after"])
    with open(stem + ".json", "w") as f:
        json.dump(record, f, indent=2, default=benchmark.json_ready)
        f.write("\n")
    with open(stem + ".md", "w") as f:
        f.write(table)
    print("\n" + table)
    record["files"] = [stem + ".json", stem + ".md", *files]
    return record


def main(argv):
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax's INFO lines from training inside benches
    from core.errors import ConfigError

    try:
        names = select(flags.FLAGS.methods, flags.FLAGS.kernels)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    record = run(names, flags.FLAGS.out, smoke=flags.FLAGS.smoke)
    print("wrote " + ", ".join(record["files"]))


if __name__ == "__main__":
    from launch.config_cli import parse_flags

    define_flags()
    app.run(main, flags_parser=parse_flags)  # an unknown flag: one line, not absl's two
