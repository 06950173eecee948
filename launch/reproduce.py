"""Reproduce each method's claims at small scale: the user-facing main job.

    python -m launch.reproduce --quick          # every method, shorter runs (a smoke check)
    python -m launch.reproduce                  # every method that has an experiment
    python -m launch.reproduce --methods=lm     # one or several, comma-separated
    python -m launch.reproduce --from_results   # re-derive the claims from saved results files

For each method it runs `methods/<slug>/experiment.py: run(workdir, quick=...)`, prints a table of
the paper's claims with the measured numbers and whether each holds, and writes
`<out>/<slug>.json` and `<out>/<slug>.md`; it ends with one table of every claim of every method
run (held / total, total duration), also at the top of `<out>/REPORT.md` (a quick run: one table
per method, see below).

JAX's persistent compilation cache is on (`core.compile_cache`: `$JAX_COMPILATION_CACHE_DIR`,
else `~/.cache/iclr26-jax`), so the seeds of one experiment compile each program once.

Experiments on the workspace's protocol also return a results record (per-seed rows, config,
code version; `core.results`): a full run saves it as `methods/<slug>/results/full.json` (commit
it: README numbers come from it), a quick run as `<out>/results/<slug>/quick.json`.
`--from_results` trains nothing: it reads those files (`--quick`: the quick ones under `--out`)
and calls the experiment's `claims_from_results(record)`; a method without that function, or
without a results file, gets a one-line message and is left out. An experiment in several parts
(each with its own record: methods/flow_mtp) names its full runs' records in
`RESULT_RUNS = ("full", "full_<part>", ...)`; `claims_from_results` gets each record in turn and
reads its part from `record["run"]`. Quick runs are one record ("quick").

A quick run (also `--quick --from_results`) ends with each method's claims beside the committed
full run's, re-derived as `--from_results` does (nothing retrained), and counts the two
separately (`launch.claims_table`): a smoke check at reduced size is not a reproduction, and the
full runs' verdicts are what say whether a claim holds.
"""

import importlib
import json
import os
import shutil
import sys
import time
from typing import NamedTuple

from absl import app, flags, logging

from core.claims import tally

_METHODS = flags.DEFINE_list("methods", None, "Methods to run (default: all with an experiment).")
_OUT = flags.DEFINE_string("out", "results", "Where the JSON and markdown reports go.")
_QUICK = flags.DEFINE_bool("quick", False, "Shorter runs: a smoke check, not a reproduction.")
_STRICT = flags.DEFINE_bool("strict", False, "Exit 1 if any claim does not hold.")
_FROM_RESULTS = flags.DEFINE_bool(
    "from_results", False, "Re-derive the claims from saved results files; train nothing."
)


def with_experiment() -> list[str]:
    import methods

    return [
        m
        for m in methods.available()
        if importlib.util.find_spec(f"methods.{m}.experiment") is not None
    ]


def claim_rows(reports) -> list[tuple[str, ...]]:
    """(method, claim, measured, n, target, holds) per claim, as text."""
    return [
        (
            r.method,
            c.text,
            c.measured_text(),
            "" if c.n is None else str(c.n),
            c.target_text(),
            "yes" if c.holds else "NO",
        )
        for r in reports
        for c in r.claims
    ]


def print_table(report, quick: bool = False) -> None:
    from launch.claims_table import SMOKE, format_table

    size = f"quick run, {SMOKE}; " if quick else ""
    print(f"\n== {report.method} ({size}{report.wall_seconds:.0f} s)")
    rows = [row[1:] for row in claim_rows([report])]
    print(format_table(rows, ("claim", "measured [interval]", "n", "target", "holds")))


def summary(reports) -> str:
    """One table of every method's claims, then held / total and the total duration."""
    from launch.claims_table import format_table

    counted = tally(c for r in reports for c in r.claims).text()
    seconds = sum(r.wall_seconds for r in reports)
    header = ("method", "claim", "measured [interval]", "n", "target", "holds")
    table = format_table(claim_rows(reports), header)
    return f"{table}\n\n{counted} over {len(reports)} methods; {seconds:.0f} s"


def summary_markdown(reports) -> str:
    counted = tally(c for r in reports for c in r.claims).text()
    seconds = sum(r.wall_seconds for r in reports)
    lines = [
        "## All claims",
        "",
        "| method | claim | measured [interval] | n | target | holds |",
        "|---|---|---|---|---|---|",
        *(f"| {' | '.join(row)} |" for row in claim_rows(reports)),
        "",
        f"{counted} over {len(reports)} methods; {seconds:.0f} s.",
        "",
    ]
    return "\n".join(lines)


def results_root(out: str, quick: bool) -> str | None:
    """Where results records go: the committed `methods/<slug>/results/` for full runs, beside
    the reports for quick ones (a smoke check is not a result to commit)."""
    return os.path.join(out, "results") if quick else None


def run_one(name: str, out: str, quick: bool):
    from core import results

    experiment = importlib.import_module(f"methods.{name}.experiment")
    start = time.perf_counter()
    report = experiment.run(os.path.join(out, "workdirs", name), quick=quick)
    report.wall_seconds = time.perf_counter() - start
    report.figures = [shutil.copy(f, out) for f in report.figures]  # beside the reports
    if report.results is not None:
        records = report.results if isinstance(report.results, list) else [report.results]
        saved = ", ".join(f"`{results.save(r, results_root(out, quick))}`" for r in records)
        report.notes = "\n\n".join(filter(None, [report.notes, f"Results: {saved}."]))
    return report


def derive_one(name: str, out: str, quick: bool):
    """The report re-derived from the method's saved results, or None (with a one-line
    message) when the method has no `claims_from_results` or no results file."""
    report = derive(name, out, quick)
    if isinstance(report, str):
        print(report)
        return None
    return report


def derive(name: str, out: str, quick: bool):
    """The report re-derived from the method's saved results (full: the committed ones), or a
    one-line message saying why it cannot be."""
    from core import results
    from core.claims import Report
    from core.errors import ConfigError

    experiment = importlib.import_module(f"methods.{name}.experiment")
    if not hasattr(experiment, "claims_from_results"):
        return (f"{name}: no claims_from_results(results) in methods/{name}/experiment.py yet; "
                f"rerun it instead: python -m launch.reproduce --methods={name}")  # fmt: skip
    runs = ("quick",) if quick else tuple(getattr(experiment, "RESULT_RUNS", ("full",)))
    claims, sources = [], []
    for run in runs:
        try:
            record = results.load(name, run, results_root(out, quick))
        except ConfigError as e:
            return str(e)
        claims += experiment.claims_from_results(record)
        code = record.get("code", {})
        dirty = " (uncommitted changes)" if code.get("git_dirty") else ""
        sources.append(
            f"`{results.path(name, run, results_root(out, quick))}` "
            f"({record.get('created')}, commit {code.get('git_commit')}{dirty}, "
            f"source hash {str(code.get('source_hash'))[:12]})"
        )
    return Report(
        method=name,
        claims=claims,
        metrics={},
        command=f"python -m launch.reproduce --methods={name} --from_results"
        + (" --quick" if quick else ""),
        notes=f"Re-derived from {'; '.join(sources)}.",
    )


def beside_full_run(report, out: str):
    """A quick run's report beside its method's committed full run (re-derived, as by
    `--from_results`: nothing retrained)."""
    from core.errors import ConfigError
    from launch.claims_table import SideBySide

    try:  # full: the committed files, whatever --out
        full = derive(report.method, out, quick=False)
    except ConfigError as e:  # a committed record its code refuses: the quick run still reports
        full = str(e)
    if isinstance(full, str):
        return SideBySide(report, None, why_no_full=full)
    return SideBySide(report, full)


class Job(NamedTuple):
    reports: list  # this run's, one per method
    sides: list | None  # quick runs: each report beside its committed full run (SideBySide)


def reproduce(names: list[str], out: str, quick: bool, from_results: bool = False) -> list:
    """Run (or re-derive) each method's experiment; its reports, in order."""
    return run_job(names, out, quick, from_results).reports


def run_job(names: list[str], out: str, quick: bool, from_results: bool = False) -> Job:
    from core import storage
    from core.errors import ConfigError
    from launch import claims_table

    storage.require_local(out, what="--out")  # reports, figures and experiment workdirs

    known = with_experiment()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"no experiment for {unknown}; available: {', '.join(known)}")
    os.makedirs(out, exist_ok=True)
    reports, sides = [], []
    for name in names:
        report = derive_one(name, out, quick) if from_results else run_one(name, out, quick)
        if report is None:
            continue
        print_table(report, quick)
        with open(os.path.join(out, f"{name}.json"), "w") as f:
            json.dump(report.to_dict(), f, indent=2)
        if quick:
            sides.append(beside_full_run(report, out))
        with open(os.path.join(out, f"{name}.md"), "w") as f:
            if quick:
                f.write(claims_table.markdown_table(sides[-1], level=2) + "\n")
            f.write(report.markdown())
        reports.append(report)
    overview = claims_table.markdown_summary(sides) if quick else summary_markdown(reports)
    with open(os.path.join(out, "REPORT.md"), "w") as f:
        f.write("# Reproduction report\n\n" + overview + "\n")
        f.write("\n".join(r.markdown() for r in reports))
    return Job(reports, sides if quick else None)


def main(argv):
    del argv
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    from core import compile_cache, preemption
    from core.errors import ConfigError

    # Every seed of an experiment compiles the same programs: compile them once (and reruns
    # load them all).
    compile_cache.enable()
    names = _METHODS.value or with_experiment()
    try:
        reports, sides = run_job(names, _OUT.value, _QUICK.value, _FROM_RESULTS.value)
    except ConfigError as e:
        sys.exit(f"error: {e}")
    except preemption.Preempted as e:
        print(e, flush=True)  # a clean exit, as for a preempted launch.train
        return
    where = f"reports in {os.path.abspath(_OUT.value)}/"
    if sides is None:
        print(f"\n== all claims\n{summary(reports)}; {where}")
    else:
        from launch.claims_table import text_summary

        print(f"\n== all claims\n{text_summary(sides)}; {where}")
    counted = tally(c for r in reports for c in r.claims)
    if _STRICT.value and counted.held < counted.total:  # the paper's claims; exploratory apart
        sys.exit(1)


if __name__ == "__main__":
    from launch.config_cli import parse_flags

    app.run(main, flags_parser=parse_flags)
