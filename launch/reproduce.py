"""Reproduce each method's claims at small scale: the user-facing main job.

    python -m launch.reproduce                  # every method that has an experiment
    python -m launch.reproduce --methods=lm     # one or several, comma-separated
    python -m launch.reproduce --quick          # shorter runs (what the tests use)

For each method it runs `methods/<slug>/experiment.py: run(workdir, quick=...)`, prints a table of
the paper's claims with the measured numbers and whether each holds, and writes
`<out>/<slug>.json` and `<out>/<slug>.md` plus `<out>/REPORT.md` for all of them.
"""

import importlib
import json
import os
import shutil
import sys
import time

from absl import app, flags, logging

_METHODS = flags.DEFINE_list("methods", None, "Methods to run (default: all with an experiment).")
_OUT = flags.DEFINE_string("out", "results", "Where the JSON and markdown reports go.")
_QUICK = flags.DEFINE_bool("quick", False, "Shorter runs: a smoke check, not a reproduction.")
_STRICT = flags.DEFINE_bool("strict", False, "Exit 1 if any claim does not hold.")


def with_experiment() -> list[str]:
    import methods

    return [
        m
        for m in methods.available()
        if importlib.util.find_spec(f"methods.{m}.experiment") is not None
    ]


def print_table(report) -> None:
    width = max([len(c.text) for c in report.claims] + [5])
    print(f"\n== {report.method} ({report.wall_seconds:.0f} s)")
    print(f"{'claim':<{width}}  {'measured':>9}  {'target':>9}  holds")
    for c in report.claims:
        target = f"{c.op}{c.target:g}"
        print(f"{c.text:<{width}}  {c.measured:>9.4g}  {target:>9}  {'yes' if c.holds else 'NO'}")


def reproduce(names: list[str], out: str, quick: bool) -> list:
    from core.errors import ConfigError

    known = with_experiment()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"no experiment for {unknown}; available: {', '.join(known)}")
    os.makedirs(out, exist_ok=True)
    reports = []
    for name in names:
        experiment = importlib.import_module(f"methods.{name}.experiment")
        start = time.perf_counter()
        report = experiment.run(os.path.join(out, "workdirs", name), quick=quick)
        report.wall_seconds = time.perf_counter() - start
        report.figures = [shutil.copy(f, out) for f in report.figures]  # beside the reports
        print_table(report)
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(report.to_dict(), f, indent=2)
        with open(os.path.join(out, f"{name}.md"), "w") as f:
            f.write(report.markdown())
        reports.append(report)
    with open(os.path.join(out, "REPORT.md"), "w") as f:
        f.write("# Reproduction report\n\n" + "\n".join(r.markdown() for r in reports))
    return reports


def main(argv):
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    from core.errors import ConfigError

    try:
        reports = reproduce(_METHODS.value or with_experiment(), _OUT.value, _QUICK.value)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    held = sum(c.holds for r in reports for c in r.claims)
    total = sum(len(r.claims) for r in reports)
    print(f"\n{held}/{total} claims hold; reports in {os.path.abspath(_OUT.value)}/")
    if _STRICT.value and held < total:
        sys.exit(1)


if __name__ == "__main__":
    app.run(main)
