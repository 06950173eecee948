"""ALI-CFM through core.train: OT-coupled batches, the pretrain -> gan -> cfm chain (the GAN
step moves G and D, the CFM stage keeps G bit for bit), each baseline's step, bad options."""

import jax
import numpy as np
import pytest

import methods
from configs import ali_cfm as config_module
from core import train
from core.errors import ConfigError
from methods import ali_cfm
from methods.ali_cfm import batches
from methods.ali_cfm import data as ali_data

ONE_DEVICE = jax.devices()[:1]


def config(arg: str, **ali):
    c = config_module.get_config(f"mesh=cpu,size=smoke,{arg}")
    c.ali.eval_samples = 0  # the ODE solve's compile is checked once, below
    c.ali.update(ali)
    return c


def params(run_or_session):
    return jax.tree.map(np.asarray, jax.device_get(run_or_session.state.params))


def test_batches_are_ot_coupled_with_one_intermediate_per_batch():
    m = ali_data.load("rotating_gmm", seed=0)
    split = batches.split_marginals(m, 3)
    rngs = lambda: [np.random.default_rng([0, j]) for j in range(64)]
    coupled = batches.examples_fn(split.train, seed=0)(rngs(), 5)
    independent = batches.examples_fn(split.train, seed=0, coupling="independent")(rngs(), 5)
    assert coupled["x_BKD"].shape == (64, 6, 2) and coupled["x_BKD"].dtype == np.float32
    # The same draws: the coupling only re-orders each marginal's points across rows.
    for k in range(6):
        a, b = coupled["x_BKD"][:, k], independent["x_BKD"][:, k]
        np.testing.assert_array_equal(np.sort(a, axis=0), np.sort(b, axis=0))
    assert batches.coupled_cost(coupled["x_BKD"]) < batches.coupled_cost(independent["x_BKD"])
    # Row 0 of the chain is the identity: x0 keeps its order.
    np.testing.assert_array_equal(coupled["x_BKD"][:, 0], independent["x_BKD"][:, 0])
    (i,) = set(coupled["i_B"].tolist())
    assert 1 <= i <= 4 and coupled["i_B"].dtype == np.int32
    picks = {batches.intermediate(split.train, 0, b) for b in range(50)}
    assert picks == {1, 2, 3, 4}


def test_pretrain_gan_cfm_chain(tmp_path):
    pc = config("role=pretrain")
    pretrain = train.run(pc, methods.make(pc), str(tmp_path / "p"), devices=ONE_DEVICE)
    g_pretrained = params(pretrain)["g"]

    gc = config(f"role=gan,pretrained={tmp_path / 'p'}")
    gan_method = methods.make(gc)
    before = params(train.init(gc, gan_method, devices=ONE_DEVICE))
    jax.tree.map(np.testing.assert_array_equal, before["g"], g_pretrained)  # restored exactly
    gan = train.run(gc, gan_method, str(tmp_path / "g"), devices=ONE_DEVICE)
    after = params(gan)
    rows = [row for row in gan.history if "g/loss" in row]
    assert {"d/loss", "g/adv", "g/reg"} <= set(rows[-1])
    moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), after, before)
    # RpGAN's losses read D only through D(fake) - D(real): its output bias gets no gradient
    # and stays put (Adam's update of a zero gradient is zero); every other leaf of both moved.
    assert moved["d"]["dense_2"].pop("bias") == 0.0
    assert min(jax.tree.leaves(moved)) > 0, moved

    cc = config(f"role=cfm,interpolant={tmp_path / 'g'}", eval_samples=16)
    cfm = train.run(cc, methods.make(cc), str(tmp_path / "c"), devices=ONE_DEVICE)
    jax.tree.map(np.testing.assert_array_equal, params(cfm)["g"], after["g"])
    w1 = {k: v for k, v in cfm.history[-1].items() if k.startswith("eval/w1/")}
    assert set(w1) == {"eval/w1/t0.500", "eval/w1/mean"} and all(v > 0 for v in w1.values())


@pytest.mark.parametrize("role", ["icfm", "otcfm", "mmfm", "linear"])
def test_baseline_takes_a_step(role, tmp_path):
    c = config(f"role={role},dataset=rotating_gmm,held_out=3")
    c.train.steps = 1
    run = train.run(c, methods.make(c), str(tmp_path), devices=ONE_DEVICE)
    assert set(params(run)) == {"v"}
    (row,) = [row for row in run.history if "loss" in row]
    assert np.isfinite(row["loss"]) and row["grad_norm"] > 0


@pytest.mark.parametrize(
    "arg, ali, match",
    [
        ("role=critic", {}, r"^role='critic' is unknown"),
        ("dataset=moons", {}, r"^dataset='moons' is unknown"),
        ("reg=l1", {}, r"^reg='l1' is unknown"),
        ("held_out=x", {}, r"^held_out='x' is not an integer"),
        ("held_out=2", {}, r"^ali.held_out=2; -1 \(none\) or 0 < k < 2"),
        ("role=gan,held_out=1", {}, r"^ali.held_out=1 leaves trimodal no intermediate"),
        ("role=cfm", {}, r"^ali.interpolant is empty"),
        ("role=cfm,interpolant=/nowhere", {}, r"^ali.interpolant='/nowhere': no run's"),
        ("role=pretrain,pretrained=/x", {}, r"^ali.pretrained='/x' is for role=gan"),
        ("role=gan", {"gan": "wgan"}, r"^ali.gan='wgan'"),
        ("role=gan", {"reg_weight": -1.0}, r"^ali.reg_weight=-1.0"),
        ("role=gan", {"width": 0}, r"^ali.width=0"),
        ("normalise=maybe", {}, r"^normalise='maybe' is unknown"),
        ("coupling=mmot", {}, r"^coupling='mmot' is unknown"),
        ("role=gan", {"coupling": "border"}, r"^ali.coupling='border'"),
        ("dataset=knot", {"data_options": {"k": 61}}, r"^knot: k must be a multiple of 3"),
        ("dataset=knot", {"data_options": {"bins": 3}}, r"^knot: bad option\(s\) \['bins'\]"),
    ],
)
def test_bad_options_are_one_line_errors(arg, ali, match):
    with pytest.raises(ConfigError) as e:
        ali_cfm.make(config(arg, **ali))
    assert "\n" not in str(e.value)
    assert e.match(match)
