"""DUPA's re-test (issue 47): the alignment's options (centring, InfoNCE, the null-label pass),
their defaults for the first two studies' configs, and the v2 experiment's wiring and claims."""

import dataclasses
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import dupa as dupa_config
from core import claims, experiment_runner, results
from core.errors import ConfigError
from methods import dupa
from methods.dupa import align, experiment, experiment_v2, retest


def smoke_config(align_preset="retest", arm="dupa"):
    return dupa_config.get_config(f"size=smoke,arm={arm},backbone=rope,align={align_preset}")


def test_defaults_are_the_first_studies_alignment_and_old_configs_read_as_it():
    config = dupa_config.get_config("size=smoke")
    settings = dupa.Settings(config)
    assert (settings.align_head, settings.align_null_label, settings.align_loss) == (
        "projector", False, "cosine",
    )  # fmt: skip
    for name in dupa.ALIGN_OPTIONS:  # a run folder's config.json written before the options
        del config.dupa[name]
    old = dupa.Settings(config)
    assert (old.align_head, old.align_null_label, old.align_loss) == ("projector", False, "cosine")
    retest_settings = dupa.Settings(smoke_config())
    assert (retest_settings.align_head, retest_settings.align_null_label) == ("centred", True)
    assert retest_settings.align_loss == "infonce"


def test_bad_alignment_options_are_refused():
    config = smoke_config()
    config.dupa.align_head = "mlp"
    with pytest.raises(ConfigError, match="align_head"):
        dupa.Settings(config)
    with pytest.raises(ConfigError, match="align"):
        dupa_config.get_config("align=centred")
    with pytest.raises(ConfigError, match="REPA"):
        dupa.Settings(smoke_config(arm="repa"))


def test_centring_cancels_a_direction_shared_by_every_image():
    z = jax.random.normal(jax.random.key(0), (2, 8, 4, 16))
    shared = 10.0 * jax.random.normal(jax.random.key(1), (16,))
    centred = align.aligned_tokens("centred", {}, z)
    # float32: the shared vector (norm ~40) adds and cancels with rounding ~1e-5
    np.testing.assert_allclose(align.aligned_tokens("centred", {}, z + shared), centred, atol=1e-4)
    np.testing.assert_allclose(centred.mean(axis=(0, 1)), 0.0, atol=1e-6)
    assert align.aligned_tokens("none", {}, z) is z


def test_infonce_is_low_only_when_the_paths_pick_out_their_own_image():
    B = 16
    images = jax.random.normal(jax.random.key(0), (B, 4, 32))
    agree = jnp.stack([images, images])
    # each negative sits at cosine ~N(0, 1/sqrt(32)) against the positive's 1: about
    # log(1 + 15 exp(-1 / 0.2) E[exp(cos / 0.2)]) = 0.14, far below log 16 = 2.8
    assert float(align.dual_path_infonce(agree, 0.2)) < 0.25
    # one direction for every image: each positive ties with B - 1 negatives -> log B
    collapsed = jnp.ones((2, B, 4, 32))
    assert float(align.dual_path_infonce(collapsed, 0.2)) == pytest.approx(math.log(B), abs=1e-4)
    # a code of the label (4 classes of 4 images): at least log 4 left
    classes = jnp.repeat(images[:4], 4, axis=0)
    coded = jnp.stack([classes, classes])
    assert float(align.dual_path_infonce(coded, 0.2)) >= math.log(4) - 1e-4


def test_the_null_label_pass_hides_the_label_from_the_aligned_tokens_only():
    config = smoke_config()
    cfg = dupa.model_config(config)
    params = dupa.init(cfg, dupa.Settings(config), None, jax.random.key(0), None)["params"]["net"]
    # Non-zero adaLN and output layers: at init every block is the identity and the output zero.
    params = jax.tree.map(lambda p: p + 0.05 * jnp.sin(jnp.arange(p.size).reshape(p.shape)), params)
    x = jax.random.uniform(jax.random.key(1), (3, 8, 8, 1), minval=-1, maxval=1)
    forward = jax.jit(
        lambda y, label: align.paths_forward(
            cfg, params, x, y, jax.random.key(2), paths=2, align_at="encoder/blocks/0",
            align_label=label,
        ),
        static_argnums=1,
    )  # fmt: skip
    null = int(cfg.num_classes)
    a, b = forward(jnp.array([1, 2, 3]), null), forward(jnp.array([7, 8, 9]), null)
    np.testing.assert_array_equal(a.features_KBND, b.features_KBND)
    assert not np.allclose(a.velocity_KBHWC, b.velocity_KBHWC)
    shared_a, shared_b = forward(jnp.array([1, 2, 3]), None), forward(jnp.array([7, 8, 9]), None)
    assert not np.allclose(shared_a.features_KBND, shared_b.features_KBND)


def test_the_retest_has_no_projector_and_the_same_network_init():
    retest_cfg, first = smoke_config(), smoke_config("projector")
    cfg = dupa.model_config(first)
    new = dupa.init(cfg, dupa.Settings(retest_cfg), None, jax.random.key(0), None)["params"]
    old = dupa.init(cfg, dupa.Settings(first), None, jax.random.key(0), None)["params"]
    assert set(new) == {"net"} and "projector" in old
    jax.tree.map(np.testing.assert_array_equal, new["net"], old["net"])  # a seed pairs the arms


def test_v2_configs_train_on_train_select_on_validation_and_vary_only_arm_lr_seed():
    a, b = (experiment_v2.config_of(arm, {"lr": 3e-4}, 1, False) for arm in (
        experiment_v2.Arm("dual"), experiment_v2.Arm("dupa")))  # fmt: skip
    assert a.eval.split == "validation" and a.train.steps == experiment_v2.STEPS
    assert a.optim.lr == 3e-4 and a.seed == 1 and a.model.position == "rope2d"
    assert (a.dupa.align_head, a.dupa.align_label, a.dupa.align_loss) == (
        "centred", "null", "infonce",
    )  # fmt: skip
    assert a.dupa.align_weight == 0.0 and b.dupa.align_weight == 0.5
    for c in (a, b):
        del c.dupa["arm"], c.dupa["align_weight"]
    assert a.to_dict() == b.to_dict()
    assert experiment_v2.EXPERIMENT.select_on == "validation/fd"
    assert experiment_v2.EXPERIMENT.run_name(quick=False) == "full_v2" == experiment.V2


def test_full_v2_joins_result_runs_with_its_record():
    has_record = os.path.exists(results.path("dupa", experiment.V2))
    assert (experiment.V2 in experiment.RESULT_RUNS) == has_record


def fake_run(config, run_dir):
    """Numbers from the arm and seed alone: DUPA 10 % below dual, dual as DDT-2B; lr 1e-3 best."""
    del run_dir
    base = {"ddt_2b": 40.0, "dual": 40.0, "dupa": 36.0}[config.dupa.arm]
    fd = base * (1 + 0.01 * config.seed) * (1 + abs(math.log10(config.optim.lr / 1e-3)))
    gap = 0.08 if config.dupa.arm == "dupa" else 0.05
    probe = 0.5 if config.dupa.arm == "dupa" else 0.45
    return {"validation/fd": fd, "test/fd": fd, "test/log_fd": math.log(fd), "test/align_gap": gap,
            "test/probe_accuracy": probe}  # fmt: skip


def test_v2_claims_derive_from_the_record_after_a_json_round_trip(tmp_path):
    fake = dataclasses.replace(experiment_v2.EXPERIMENT, run=fake_run, seeds=(0, 1, 2))
    record = experiment_runner.measure(fake, str(tmp_path))
    assert record["run"] == "full_v2"
    path = results.save(record, str(tmp_path / "results"))
    reread = results.load("dupa", "full_v2", str(tmp_path / "results"))
    assert os.path.exists(path)
    claims = experiment.claims_from_results(reread)
    assert [c.holds for c in claims] == [True, True, True, True, True]
    assert claims[0].metric == "test log FD: dual - dupa"
    assert claims[0].interval.mean == pytest.approx(math.log(40 / 36))
    assert claims[0].margin == pytest.approx(math.log(1 / 0.95))
    # The table: validation means per lr with the (validation) choice in bold, then the chosen
    # runs' test FD per seed (DUPA seed 2: 36 x 1.02), gap and probe.
    table = experiment_v2.table(reread).splitlines()
    assert table[4] == "| dupa | 55.37 | **36.36** | 53.71 | 72.72 |"  # x (1 + |log10(lr / 1e-3)|)
    assert table[-1] == "| dupa | 0.001 | 36.00 | 36.36 | 36.72 | 36.36 | 0.080 | 0.50 |"
    (figure,) = experiment_v2.plot(reread, str(tmp_path))
    assert figure.endswith("dupa_v2.png") and os.path.getsize(figure) > 10_000


def test_the_pilot_gives_each_pairs_paired_spread_and_a_power_that_grows_with_seeds(tmp_path):
    def pilot_run(config, run_dir):  # dupa's log FD moves by 0, .02, .04 with the seed
        metrics = fake_run(config, run_dir)
        shift = 0.02 * config.seed if config.dupa.arm == "dupa" else 0.0
        return metrics | {"validation/log_fd": math.log(metrics["validation/fd"]) + shift}

    pilot = dataclasses.replace(experiment_v2.PILOT, run=pilot_run)
    spread = experiment_v2.pilot_spread(experiment_runner.measure(pilot, str(tmp_path)))
    # The paired differences, not each arm's spread: ddt_2b and dual move together by seed.
    assert spread["ddt_2b - dual"] == pytest.approx(0.0, abs=1e-12)
    # dupa - dual = log(36/40) + .02 seed: sd of (0, .02, .04) = .02.
    assert spread["dual - dupa"] == pytest.approx(0.02)
    effect, margin = experiment_v2.PAPER_EFFECT, experiment_v2.MARGIN
    more, fewer = (claims.power("beats", effect, 0.02, n, margin, trials=200) for n in (5, 3))
    assert more > fewer


@pytest.mark.slow  # one 2-step run and two evaluations of 20 samples: ~40 s at load ~9
def test_a_retest_run_returns_every_metric_the_claims_and_the_selection_read(tmp_path):
    config = experiment_v2.config_of(experiment_v2.Arm("dupa"), {"lr": 1e-3}, 0, False)
    smoke = smoke_config()
    config.model, config.dupa.align_block = smoke.model, smoke.dupa.align_block
    config.train.steps = config.train.eval_every = 2
    config.train.log_every, config.optim.warmup_steps = 1, 1
    config.exp.samples, config.eval.sample_steps = 20, 2
    out = retest.run(config, str(tmp_path))
    for split in ("validation", "test"):
        for name in ("fd", "log_fd", "probe_accuracy", "align_gap", "cond_accuracy"):
            assert np.isfinite(out[f"{split}/{name}"]), (split, name)
    assert out["validation/velocity_loss"] > 0
