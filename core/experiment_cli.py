"""The command line of a `core.experiment_runner.Experiment` (written once; each re-test was its
own copy): train the grid, or a pilot or smoke form of it, in one process or several, and print
the claims' verdicts.

    def main() -> None:
        experiment_cli.main(EXPERIMENT, claims_from_results=claims_from_results,
                            pilot=PILOT, pilot_lines=pilot_lines, smoke=SMOKE, table=report.table)

    python -m methods.M.experiment_v2 --workdir=W --smoke         # the smoke form, seconds
    python -m methods.M.experiment_v2 --workdir=W --pilot         # the pilot's lines
    for w in 0 1; do python -m methods.M.experiment_v2 --workdir=W --worker=$w --workers=2 & done
    python -m methods.M.experiment_v2 --workdir=W                 # the grid: saves its record
    python -m methods.M.experiment_v2 --from_results              # the committed record's claims

Every run goes through the runner's cache (`experiment_runner.run_one`), so `--workers` only
fills it: the run without it then reads every run back and saves the record. A pilot's runs are
the grid's own configs, so the grid reuses them.
"""

import argparse
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence

from core import experiment_runner, results
from core.claims import verdict_lines
from core.errors import ConfigError
from core.experiment_runner import Experiment


def fill(experiment: Experiment, workdir: str, worker: int, workers: int) -> int:
    """Run this worker's share of `experiment`'s runs, every `workers`-th job from the `worker`-th,
    through the runner's cache (the entries `measure` reads back); returns the share's size."""
    if not 0 <= worker < workers:
        raise ConfigError(f"{experiment.slug}: worker={worker} must be in [0, workers={workers})")
    e = experiment
    code = experiment_runner.code_key(e)
    share = experiment_runner.jobs(e)[worker::workers]
    for arm, point, seed in share:
        label = experiment_runner.job_label(e.slug, arm.name, point, seed)
        experiment_runner.run_one(
            e, e.config_of(arm, point, seed, False), code, workdir, f"{label} (worker {worker})"
        )
    return len(share)


def main(
    experiment: Experiment,
    *,
    claims_from_results: Callable[[dict], list],
    pilot: Experiment | None = None,
    pilot_lines: Callable[[dict], list[str]] | None = None,
    smoke: Experiment | None = None,
    table: Callable[[dict], str] | None = None,
    plot: Callable[[dict, str], list[str]] | None = None,
    description: str | None = None,
    argv: Sequence[str] | None = None,
    results_root: str | None = None,
) -> None:
    """Parse `argv` (the process's by default) and do what it asks (the module docstring).

    pilot / pilot_lines: `--pilot` measures `pilot` and prints `pilot_lines(record)` (its spread
    and the claims' power); no record is saved. smoke: `--smoke` measures it with quick=True and
    prints its claims. table: printed before the claims of the grid and of `--from_results`.
    plot: plot(record, folder) -> the figures it wrote there, for the grid's record and that of
    `--from_results` (a figure re-derived from the committed record); each is copied beside the
    method's README (`<root>/<slug>/` with `results_root`), less a leading "<slug>_".
    results_root: where the grid's record is saved and read (`results.path`; None: the method's
    results/ folder)."""
    from core import compile_cache

    slug = experiment.slug
    parser = argparse.ArgumentParser(description=description or __doc__.split("\n\n")[0])
    parser.add_argument("--workdir", help="the run cache and run directories (to train)")
    mode = parser.add_mutually_exclusive_group()
    if smoke is not None:
        mode.add_argument("--smoke", action="store_true", help="the smoke form, tiny sizes")
    if pilot is not None:
        mode.add_argument("--pilot", action="store_true", help="the pilot: spread and power")
    mode.add_argument("--from_results", action="store_true", help="the committed record")
    parser.add_argument("--worker", type=int, default=0, help="with --workers: this share")
    parser.add_argument("--workers", type=int, default=1, help="> 1: fill the cache, no record")
    args = parser.parse_args(argv)

    def show(record: dict) -> None:  # the grid's record: its table, its claims, its figures
        lines = [table(record)] if table else []
        print("\n".join(lines + verdict_lines(claims_from_results(record))))
        if plot is None:
            return
        # Beside the README (methods/<slug>/), or beside the records under `results_root`.
        here = results_root and os.path.join(results_root, slug)
        here = here or os.path.join(results.REPO, "methods", slug)
        with tempfile.TemporaryDirectory() as folder:
            for figure in plot(record, folder):
                name = os.path.basename(figure).removeprefix(f"{slug}_")
                print("figure", shutil.copy(figure, os.path.join(here, name)))

    is_pilot, is_smoke = getattr(args, "pilot", False), getattr(args, "smoke", False)
    if args.from_results:
        try:
            record = results.load(slug, experiment.run_name(quick=False), results_root)
        except ConfigError as err:
            parser.error(str(err))  # one line: no record yet
        show(record)
        return
    if not args.workdir:
        parser.error("--workdir is required to train")
    compile_cache.enable()
    if is_smoke:
        record = experiment_runner.measure(smoke, args.workdir, quick=True)
        print("\n".join(verdict_lines(experiment_runner.claims(smoke, record))))
        return
    chosen = pilot if is_pilot else experiment
    if args.workers > 1:
        n = fill(chosen, args.workdir, args.worker, args.workers)
        print(f"worker {args.worker} of {args.workers}: {n} runs in the cache; run again without "
              "--workers to read them back")  # fmt: skip
        return
    record = experiment_runner.measure(chosen, args.workdir)
    if is_pilot:
        print("\n".join(pilot_lines(record) if pilot_lines else []))
        return
    print("saved", results.save(record, results_root))
    show(record)
