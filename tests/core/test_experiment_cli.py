"""core.experiment_cli on the fake experiment of test_experiment_runner (no training): workers
fill the cache that the grid reads back, the pilot saves nothing, the grid saves its record and
--from_results re-derives the same verdicts."""

import dataclasses
import os

import pytest

from core import experiment_cli, results
from core import experiment_runner as er
from core.claims import verdict_lines
from core.errors import ConfigError
from tests.core.test_experiment_runner import FakeRuns, experiment


def no_runs_left(config, run_dir):
    raise AssertionError(f"every run should be cached; ran {config}")


def test_workers_fill_the_cache_that_measure_reads(tmp_path):
    runs = FakeRuns()
    exp = experiment(runs)
    sizes = [experiment_cli.fill(exp, str(tmp_path), w, 3) for w in range(3)]
    every = len(er.jobs(exp))
    assert sum(sizes) == every == 2 * 5 * 4 and len(runs.calls) == every
    assert len(set(runs.calls)) == every  # no job ran twice across the workers
    record = er.measure(dataclasses.replace(exp, run=no_runs_left), str(tmp_path))
    assert len(record["rows"]) == every
    with pytest.raises(ConfigError, match="worker=3 must be in"):
        experiment_cli.fill(exp, str(tmp_path), 3, 3)


def plot(record, folder):
    path = os.path.join(folder, f"toy_{record['run']}.png")
    with open(path, "w") as f:
        f.write(f"{len(record['rows'])} rows")
    return [path]


def test_main_pilot_then_grid_then_from_results(tmp_path, capsys):
    runs = FakeRuns()
    exp = experiment(runs)
    pilot = dataclasses.replace(exp, part="pilot", arms=exp.arms[:1], seeds=(0, 1), claims=())
    kw = dict(
        claims_from_results=lambda record: er.claims(exp, record),
        pilot=pilot,
        pilot_lines=lambda record: [f"pilot rows {len(record['rows'])}"],
        results_root=str(tmp_path / "results"),
        table=lambda record: f"table of {record['run']}",
        plot=plot,
    )
    work = ["--workdir", str(tmp_path / "work")]
    with pytest.raises(SystemExit):  # no record yet: a one-line error, not a traceback
        experiment_cli.main(exp, argv=["--from_results"], **kw)
    experiment_cli.main(exp, argv=[*work, "--pilot"], **kw)
    assert capsys.readouterr().out.splitlines()[-1] == "pilot rows 10"  # 5 lrs x 2 seeds
    assert not (tmp_path / "results").exists()  # a pilot saves no record
    experiment_cli.main(exp, argv=[*work, "--worker", "1", "--workers", "2"], **kw)
    # Half the grid's 40 (seeds 1 and 3), less the pilot's 5 on seed 1 of "better": cached.
    assert len(runs.calls) == 10 + 20 - 5
    experiment_cli.main(exp, argv=work, **kw)
    live = capsys.readouterr().out.splitlines()
    assert len(runs.calls) == len(set(runs.calls)) == 40  # each of the grid's runs once
    figure = tmp_path / "results" / "toy" / "full.png"  # beside the record, "toy_" dropped
    assert live[-1] == f"figure {figure}" and figure.read_text() == "40 rows"
    live = live[:-1]
    assert live[-3] == "table of full"
    assert live[-2].startswith("holds  better beats base: 0.1 [")
    assert live[-1].startswith("holds  base is fine: ")
    assert results.load("toy", "full", str(tmp_path / "results"))["rows"]
    experiment_cli.main(exp, argv=["--from_results"], **kw)
    assert capsys.readouterr().out.splitlines() == [*live[-3:], f"figure {figure}"]
    with pytest.raises(SystemExit):  # training needs a workdir
        experiment_cli.main(exp, argv=[], **kw)


def test_verdict_lines_say_no_for_a_claim_that_fails(tmp_path):
    exp = experiment(FakeRuns())
    record = er.measure(exp, str(tmp_path))
    failing = dataclasses.replace(exp.claims[0], margin=10.0)  # far above the fake's effect
    claims = er.claims(dataclasses.replace(exp, claims=(failing,)), record)
    assert verdict_lines(claims)[0].startswith("NO     better beats base: ")
