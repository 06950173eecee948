"""NAB's experiment on the protocol: choices made on development objects only, by held-out
views, a grid edge stops the run before any reported fit, and the claims re-derive from the
results record. Fits are replaced by a fake (no training) except in the slow quick run."""

import dataclasses

import jax
import numpy as np
import pytest

from configs import nab as nab_config
from core import results, selection
from core.errors import ConfigError
from methods import nab
from methods.nab import experiment, fit, model, phantoms, projector, report

SMALL = dataclasses.replace(
    experiment.QUICK,
    development=(("industrial", 1000), ("curved", 1000)),
    reported={"industrial": (0, 1, 2), "curved": (0, 1, 2)},
    grids={
        "nab": {"theta_init": ("zero", "uniform"), "steepness": (0.75, 1.5, 3.0)},
        "rff": {"rff_sigma": (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)},
    },
    ablations=("frozen centres",),
)


class FakeFits:
    """Stands in for `fit.train_and_evaluate`: scores from the config alone, and a log of every
    (phantom, object seed) fitted. Held-out-view SNR peaks at steepness 1.5 / sigma 2 (an
    interior choice), the ground-truth PSNR at steepness 3 / sigma 4 (another choice), so a
    selection on the truth is visible. `reported_offset` changes reported objects' numbers."""

    def __init__(self, reported_offset=0.0, nab_gain=3.0):
        self.fitted, self.reported_offset, self.nab_gain = [], reported_offset, nab_gain

    def __call__(self, config, run_dir):
        del run_dir
        d, m = config.data, config.model
        self.fitted.append((d.phantom, d.object_seed))
        x = np.log2(m.steepness[0] / 1.5) if m.encoding == "nab" else np.log2(m.rff_sigma / 2)
        offset = self.reported_offset if d.object_seed < 1000 else 0.0
        psnr = 25 + 0.1 * d.object_seed + offset - (x - 1) ** 2  # truth: best one step up
        psnr += self.nab_gain * (m.encoding == "nab") * (1 - 0.4 * bool(m.frozen))
        val = 30 - x**2 + (m.theta_init == "uniform") + offset
        return {
            "psnr": psnr,
            "ssim": psnr / 40,
            "val_snr_db": val,
            "final_loss": 0.01,
            "seconds": 0.0,
            "image": [[0.0]],
        }


def _classical(config):
    q = {"psnr": 20.0, "ssim": 0.3, "image": [[0.0]]}
    return {"data": {"mean_square": 1.0}, "fbp": q, "sart": q}


@pytest.fixture
def fake(monkeypatch):
    fits = FakeFits()
    monkeypatch.setattr(fit, "train_and_evaluate", fits)
    monkeypatch.setattr(fit, "classical", _classical)
    monkeypatch.setattr(experiment, "QUICK", SMALL)
    return fits


def test_selection_never_sees_a_reported_object(fake, tmp_path, monkeypatch):
    """Every score `select` reads is a development object's; every fit before the last
    selection is on a development object; other numbers on the reported objects change no
    choice. Planting `s.reported` into `choose`'s loop fails the first assertion."""
    keys, fits_before = set(), []
    real_select = selection.select

    def spy(grid, scores, **kw):
        keys.update(key for by_seed in scores.by_point.values() for key in by_seed)
        fits_before.append(len(fake.fitted))
        return real_select(grid, scores, **kw)

    monkeypatch.setattr(selection, "select", spy)
    record, _ = experiment.measure(str(tmp_path / "a"), quick=True)
    assert keys == {"industrial/1000", "curved/1000"}
    assert set(fake.fitted[: max(fits_before)]) == {("industrial", 1000), ("curved", 1000)}
    assert {r["object"] for r in record["rows"] if r["stage"] == "reported"} == {0, 1, 2}

    monkeypatch.setattr(fit, "train_and_evaluate", FakeFits(reported_offset=-5.0))
    other, _ = experiment.measure(str(tmp_path / "b"), quick=True)
    assert other["chosen"] == record["chosen"]
    with pytest.raises(ConfigError, match="development object curved/2 is also reported"):
        dataclasses.replace(SMALL, development=(("curved", 2),))


def test_choices_follow_heldout_views_not_the_ground_truth(fake, tmp_path):
    record, _ = experiment.measure(str(tmp_path), quick=True)
    nab_, rff = record["chosen"]["nab"], record["chosen"]["rff"]
    assert nab_["point"] == {"theta_init": "uniform", "steepness": 1.5}
    assert rff["point"] == {"rff_sigma": 2.0}
    assert nab_["truth_best"]["steepness"] == 3.0 and rff["truth_best"]["rff_sigma"] == 4.0
    chosen_rows = [r for r in record["rows"] if r["stage"] == "reported" and r["method"] == "nab"]
    assert {(r["theta_init"], r["steepness"]) for r in chosen_rows} == {("uniform", 1.5)}


def test_a_choice_on_a_grid_edge_stops_the_run_before_any_reported_fit(fake, tmp_path, monkeypatch):
    edged = dataclasses.replace(
        SMALL, grids={**SMALL.grids, "rff": {"rff_sigma": (0.5, 1.0)}}, require_interior=True
    )
    monkeypatch.setattr(experiment, "QUICK", edged)
    with pytest.raises(ConfigError, match=r"grid not finished.*rff rff_sigma=1.0 \(high\)"):
        experiment.measure(str(tmp_path), quick=True)
    assert all(seed >= 1000 for _, seed in fake.fitted)


def test_claims_rederive_from_the_saved_record_and_can_fail(fake, tmp_path, monkeypatch):
    """Saved and loaded, the record gives the same claims; the fake's NAB gain of 3 dB holds
    the 1 dB margin, a gain of 0.5 dB does not; a frozen fit that keeps 60 % of the gain does
    not "keep less than half"."""
    record, _ = experiment.measure(str(tmp_path / "a"), quick=True)
    path = results.save(record, str(tmp_path / "r"))
    again = experiment.claims_from_results(results.load("nab", "quick", str(tmp_path / "r")))
    claims = experiment.claims_from_results(record)
    assert path.endswith("nab/quick.json")
    assert [c.to_dict() for c in again] == [c.to_dict() for c in claims]
    held = {c.metric: c.holds for c in claims}
    # A quick record's SSIM claim is the smoke check against FBP (the fake's 0.3), a full
    # record's the gain over RFF: both hold for the fake's NAB.
    assert held["industrial/16v psnr: nab - rff"] and held["industrial/16v ssim: nab - fbp"]
    assert "industrial/16v ssim: nab - rff" not in held
    as_full = experiment.claims_from_results({**record, "run": "full"})
    assert {c.metric: c.holds for c in as_full}["industrial/16v ssim: nab - rff"]
    assert not held["industrial/16v psnr: (nab + rff) / 2 - frozen centres"]
    # The fake's gain is the same on both families: "smaller on curved" cannot hold.
    assert not held["16v psnr gain: industrial - curved"]
    monkeypatch.setattr(fit, "train_and_evaluate", FakeFits(nab_gain=0.5))
    weak, _ = experiment.measure(str(tmp_path / "b"), quick=True)
    held = {c.metric: c.holds for c in experiment.claims_from_results(weak)}
    assert not held["industrial/16v psnr: nab - rff"]
    # A NAB no better than FBP (fake PSNR ~11 dB, SSIM ~0.28, FBP's 0.3): the smoke check fails.
    monkeypatch.setattr(fit, "train_and_evaluate", FakeFits(nab_gain=-13.0))
    unfit, _ = experiment.measure(str(tmp_path / "c"), quick=True)
    held = {c.metric: c.holds for c in experiment.claims_from_results(unfit)}
    assert not held["industrial/16v ssim: nab - fbp"]
    assert "nab - rff" in report.table(record)


def test_the_full_setting_derives_every_claim_on_fake_fits(fake, tmp_path, monkeypatch):
    """FULL end to end with the fake (an hour's run must not fail at its last step): 112 fits
    (development: (24 NAB + 12 RFF points) x 2 objects; reported: 5 industrial objects x 2
    views x 2 encodings, 5 curved x 2 encodings, 2 ablations x 5), the chosen points inside
    their grids, and the six claims, each on 5 objects."""
    monkeypatch.setattr(experiment, "QUICK", experiment.FULL)
    record, images = experiment.measure(str(tmp_path), quick=True)
    assert len(fake.fitted) == 112 and {"fbp", "sart", "rff", "nab"} <= set(images)
    assert record["chosen"]["nab"]["point"]["steepness"] == 2.0
    claims = experiment.claims_from_results({**record, "run": "full"})  # measured as "quick"
    assert [c.metric for c in claims] == [
        "industrial/12v psnr: nab - rff",
        "industrial/16v psnr: nab - rff",
        "industrial/16v ssim: nab - rff",
        "16v psnr gain: industrial - curved",
        "industrial/16v psnr: (nab + rff) / 2 - frozen centres",
        "industrial/16v psnr: (nab + rff) / 2 - frozen sizes",
    ]
    assert {c.n for c in claims} == {5}
    assert "| curved | 4 | 16 |" in report.table(record)


def test_heldout_views_lie_between_the_training_views_with_their_own_noise():
    """The held-out angles are the training angles plus half a step; their noise is another
    draw, uncorrelated with the training views'; a blurred image scores lower than the truth.
    Held-out angles equal to the training ones, or the training noise reused, fail it."""
    config = nab_config.get_config("size=smoke,views=8")
    config.model.size = 32
    truth_NN, sino_DA, angles_A = nab.problem(config)
    val_DA, val_A = fit.heldout_views(config)
    np.testing.assert_allclose(val_A, angles_A + 180 / 16, rtol=1e-6)
    truth_snr = fit.heldout_snr_db(truth_NN, val_DA, val_A)
    # 1 % noise caps the SNR at 40 dB; at 32 x 32 the finer measurement grid's mismatch with
    # our operator (a few %) caps it near 29 dB.
    assert 20 < truth_snr < 40, truth_snr
    blurred = 0.25 * (truth_NN + np.roll(truth_NN, 1, 0) + np.roll(truth_NN, 1, 1) + truth_NN)
    assert fit.heldout_snr_db(blurred, val_DA, val_A) < truth_snr - 3
    noise = {}
    for name, measured, offset in (("train", sino_DA, 0.0), ("held out", val_DA, 180 / 16)):
        clean = phantoms.measure(truth_NN, 8, noise=0.0, offset=offset)
        noise[name] = (measured - clean).ravel()
    # 256 independent pairs: a correlation's standard error is ~0.06; the same draw gives 1.
    assert abs(np.corrcoef(noise["train"], noise["held out"])[0, 1]) < 0.25


@pytest.mark.parametrize("init", ["torch", "he"])
def test_mlp_init_scales(init):
    cfg = model.ModelConfig(size=16, num_features=512, hidden=512, depth=1, mlp_init=init)
    params, _ = model.init_params(cfg, jax.random.PRNGKey(0))
    w, b = (np.asarray(params["mlp"][0][k]) for k in ("w", "b"))  # 512 x 512
    # 262k weights: their std is within 1 % of the intended one
    expected = np.sqrt(2 / 512) if init == "he" else 1 / np.sqrt(512) / np.sqrt(3)
    np.testing.assert_allclose(w.std(), expected, rtol=0.01)
    assert (not b.any()) if init == "he" else np.abs(b).max() <= 1 / np.sqrt(512)


def test_quick_and_full_settings_keep_development_and_reported_objects_apart():
    for s in (experiment.QUICK, experiment.FULL):
        for phantom, seed in s.development:
            assert seed not in s.reported.get(phantom, ())
    assert projector.angles(4).tolist() == [0, 45, 90, 135]  # the offset is on top of these


# 10 fits at 32 x 32, 500 steps: 248 s on 2 cores under a load of ~27 from other jobs, warm
# compile cache (not timed idle), so marked slow (`pytest -m slow tests/methods/...`).
@pytest.mark.slow
def test_quick_experiment_claims_hold(tmp_path):
    """Three 32 x 32 industrial objects, 16 noisy views, 500 steps, every choice made on
    development object 1000. NAB beats RFF in PSNR by the 1 dB margin (measured +3.56 [+2.51,
    +5.19] dB), the smoke check holds (NAB's SSIM above FBP's by > 0.05: +0.245 [+0.157,
    +0.364]; NAB at lr 0 gave -0.545), NAB's SSIM is above RFF's on every object, and every
    reported fit explains > 99 % of the sinogram's power. At 32 x 32 the SSIM gain over RFF
    (+0.082 [+0.029, +0.126]) does not clear the full run's 0.05, so it is not claimed here."""
    report = experiment.run(str(tmp_path), quick=True)
    claims = {c.metric: c for c in report.claims}
    assert all(c.holds for c in report.claims), claims
    assert set(claims) == {"industrial/16v psnr: nab - rff", "industrial/16v ssim: nab - fbp"}
    rows = report.results["rows"]
    ssim = {m: experiment.by_object(report.results, "ssim", method=m) for m in ("nab", "rff")}
    assert all(ssim["nab"][o] > ssim["rff"][o] for o in ssim["rff"]), ssim
    for row in rows:
        if row["stage"] == "reported" and row["method"] in ("nab", "rff"):
            assert row["final_loss"] < 0.01 * row["data_mean_square"], row
