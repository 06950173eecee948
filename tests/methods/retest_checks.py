"""Shared by the methods whose default job reports a first study and its issue-47 re-test: the
full run (`experiment.run`) with the committed records standing in for the training."""

import os

from core import experiment_runner, results


def full_job_report(experiment, slug: str, workdir: str, monkeypatch):
    """(experiment.run(workdir)'s report, the first study's record, the re-test's), after
    checking that the report holds both records in that order and every claim of each, and that
    its figures were drawn. `experiment.measure` returns the first record, the runner's
    `measure` (the re-test's) the second."""
    first, retested = (results.load(slug, run) for run in ("full", experiment.V2))
    monkeypatch.setattr(experiment, "measure", lambda workdir, quick: first)
    monkeypatch.setattr(experiment_runner, "measure", lambda exp, wd: retested)
    report = experiment.run(workdir)
    assert [r["run"] for r in report.results] == ["full", experiment.V2]
    expected = experiment.claims_from_results(first) + experiment.claims_from_results(retested)
    assert [c.text for c in report.claims] == [c.text for c in expected]
    assert report.figures and all(os.path.getsize(f) > 0 for f in report.figures)
    return report, first, retested
