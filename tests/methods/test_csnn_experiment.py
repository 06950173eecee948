"""The CSNN experiment's reduced run: CSNN against GCN on the barbell (seed 0, 800 steps of 32
fresh graphs), where GCN fails by construction; and its run cache (config and code)."""

import math
import os

import pytest

from methods.csnn import experiment, tasks


# 79 s on 2 loaded cores (load average ~9; about 30 s expected alone), over the ~45 s a
# method's default tests may take: run it with -m slow (or `python -m launch.reproduce
# --methods=csnn --quick`).
@pytest.mark.slow
def test_reduced_barbell_run_beats_gcn(tmp_path):
    report = experiment.run(str(tmp_path), quick=True)
    below_constant, below_gcn = report.claims
    # The margins are the claims' (experiment.QUICK_BARBELL_RATIO, its basis there): measured
    # on seed 0 CSNN at 0.053 of the constant's MSE and 20x below GCN. A CSNN that lost its
    # separate source and target maps would not get there (README: S = T does no better than
    # GCN, the paper's Proposition 3.1).
    assert below_constant.holds, (below_constant.measured, report.metrics["barbell"])
    assert below_gcn.holds, (below_gcn.measured, report.metrics["barbell"])
    mse = report.metrics["table"]["barbell_test_mse"]
    # GCN cannot hear the other clique: it stays near (here above) the constant predictor.
    assert mse["gcn"] > 0.7 * tasks.barbell_constant_mse()
    assert all(math.isfinite(v) for v in mse.values())
    assert os.path.getsize(report.figures[0]) > 1000


def test_runs_are_cached_by_config_and_code(tmp_path, monkeypatch):
    """A finished run is read back, never retrained; an edited config or an edited source
    (another code hash) is a new run in its own run directory (core.cache)."""
    calls = []

    def fake_train(config, run_dir):
        calls.append(run_dir)
        return [{"step": config.train.steps, "eval/test_accuracy": 0.25}]

    monkeypatch.setattr(experiment, "train_and_evaluate", fake_train)
    workdir = str(tmp_path)
    config = experiment.config_for("tree", "csnn", 5, depth=2)
    rows = experiment.eval_rows(config, workdir, "code-a", "tree")
    assert experiment.eval_rows(config, workdir, "code-a", "tree") == rows and len(calls) == 1
    experiment.eval_rows(config, workdir, "code-b", "tree")
    longer = experiment.config_for("tree", "csnn", 6, depth=2)
    assert experiment.eval_rows(longer, workdir, "code-a", "tree")[0]["step"] == 6
    assert len(calls) == 3 and len(set(calls)) == 3


def test_ablations_are_paired_with_csnn_by_split_not_by_order():
    def runs(tests: dict) -> list[dict]:
        return [{"split": k, "test": v, "step": 1} for k, v in tests.items()]

    mine = {
        "csnn": runs({0: 0.90, 1: 0.80, 2: 0.70}),
        "gcn": runs({2: 0.60, 0: 0.85, 1: 0.75}),  # 0.10, 0.05, 0.05 below, listed out of order
        "csnn:single_operator": runs({1: 0.79}),
    }
    paired = experiment.paired_minus_csnn(mine)
    assert set(paired) == {"gcn", "csnn:single_operator"}
    # Differences -0.05, -0.05, -0.10: SD 0.05 / sqrt(3), SE 1/60. Pairing in list order would
    # give -0.30, +0.05, +0.05 (the same mean, SE 0.117). 1e-12: float sums of three decimals.
    assert abs(paired["gcn"]["mean"] - (-0.20 / 3)) < 1e-12
    assert abs(paired["gcn"]["se"] - 1 / 60) < 1e-12 and paired["gcn"]["splits"] == 3
    assert abs(paired["csnn:single_operator"]["mean"] - (-0.01)) < 1e-12
    assert paired["csnn:single_operator"]["se"] is None  # one split: no spread to report


def test_run_lists_parse_and_reject_malformed_items():
    assert experiment.parse_runs("csnn@4,csnn:not_conformal@12") == [
        ("csnn", 4),
        ("csnn:not_conformal", 12),
    ]
    for bad in ("csnn", "csnn@x", "gat@1", "csnn@-1", "csnn:bogus@1"):
        with pytest.raises(ValueError, match="is not <model>@<split>"):
            experiment.parse_runs(bad)
