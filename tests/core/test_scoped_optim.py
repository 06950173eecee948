"""core.optim.scoped (an optimiser per labelled part of the params, frozen parts without state)
and gradient_step's update_args / opt_metrics."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from core import optim, steps
from core.errors import ConfigError
from core.sharding import path_str
from core.state import TrainState

LR, DECAY = 0.1, 0.5


def two_networks():
    """An encoder (with a -0.0 entry, which p + 0.0 would turn into +0.0) and a head; each has
    a leaf the loss never reads, so its gradient is zero."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(0))
    return {
        "encoder": {
            "kernel": jax.random.normal(k1, (3, 4)),
            "bias": jnp.array([-0.0, 0.0, 1.0, -2.0]),
            "unused": jnp.ones(2),
        },
        "head": {"kernel": jax.random.normal(k2, (4, 1)), "unused": jnp.ones(2)},
    }


def regression(params, batch, *, rng, extra):
    del rng, extra
    e, h = params["encoder"], params["head"]
    hidden_BH = jnp.tanh(batch["x"] @ e["kernel"] + e["bias"])
    err_B = (hidden_BH @ h["kernel"])[:, 0] - batch["y"]
    return jnp.mean(err_B**2), {"max_err": jnp.max(jnp.abs(err_B))}


def batch():
    x = jax.random.normal(jax.random.PRNGKey(1), (16, 3))
    return {"x": x, "y": x[:, 0] - x[:, 1]}


def frozen_encoder_tx():
    return optim.scoped(
        [(r"^encoder/", None), (r"^head/", "head")],
        {"head": optax.adamw(LR, weight_decay=DECAY)},
    )


def fresh_state(params, opt_state):
    return TrainState(jnp.int32(0), jax.random.PRNGKey(0), params, opt_state, {})


def state_paths(opt_state) -> list[str]:
    return [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(opt_state)[0]]


def run(step, state, n):
    step = jax.jit(step)
    for _ in range(n):
        state, metrics = step(state, batch(), rng=jax.random.PRNGKey(2))
        state = state.replace(step=state.step + 1)
    return state, metrics


def test_frozen_part_is_bitwise_unchanged_stateless_and_undecayed():
    params = two_networks()
    tx = frozen_encoder_tx()
    state0 = fresh_state(params, steps.init_opt_state(tx, params))
    paths = state_paths(state0.opt_state)
    assert any("head/kernel" in p for p in paths)  # adam moments of the head ...
    assert not any("encoder" in p for p in paths)  # ... and nothing at all for the encoder
    state, metrics = run(steps.gradient_step(regression, tx), state0, 10)

    for name, before in params["encoder"].items():
        after = np.asarray(state.params["encoder"][name])
        assert after.tobytes() == np.asarray(before).tobytes(), name  # bitwise: -0.0 kept
    assert not np.array_equal(state.params["head"]["kernel"], params["head"]["kernel"])
    # Zero gradient: Adam's step is 0, so only the decoupled decay moves the leaf, by a factor
    # (1 - lr * decay) a step. float32 products of ten factors.
    np.testing.assert_allclose(state.params["head"]["unused"], (1 - LR * DECAY) ** 10, rtol=1e-6)
    assert np.isfinite(float(metrics["grad_norm"])) and "max_err" in metrics


def test_scoped_update_leaves_frozen_params_bitwise_under_plain_apply_updates():
    """Outside gradient_step (a method's own step), the frozen update is -0.0: p + -0.0 is p."""
    params = two_networks()
    tx = frozen_encoder_tx()
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    new = optax.apply_updates(params, updates)
    for name, before in params["encoder"].items():
        assert np.asarray(new["encoder"][name]).tobytes() == np.asarray(before).tobytes()


def test_frozen_encoder_gets_no_backward_pass():
    """The encoder is not differentiated: the step traces the two forward matmuls and the head
    kernel's gradient, not the two backward matmuls through the encoder."""
    params = two_networks()
    tx = frozen_encoder_tx()
    state = fresh_state(params, tx.init(params))

    def dots(step, state):
        jaxpr = jax.make_jaxpr(lambda s: step(s, batch(), rng=None))(state)
        return str(jaxpr).count("dot_general")

    assert dots(steps.gradient_step(regression, tx), state) == 3
    everything = optax.adamw(LR, weight_decay=DECAY)  # the same count, differentiating all
    assert (
        dots(
            steps.gradient_step(regression, everything),
            state.replace(opt_state=everything.init(params)),
        )
        == 5
    )


def gan_losses():
    """A toy game on two scalars-vectors: each player's loss reads both networks."""

    def generator_loss(params, batch, *, rng, extra):
        del batch, rng, extra
        return jnp.sum((params["gen"]["w"] * params["disc"]["w"] - 1.0) ** 2), {}

    def discriminator_loss(params, batch, *, rng, extra):
        del batch, rng, extra
        return jnp.sum((params["gen"]["w"] + params["disc"]["w"]) ** 2), {}

    return generator_loss, discriminator_loss


def test_two_scoped_states_under_switch_each_update_only_their_network():
    params = {"gen": {"w": jnp.array([0.5, -1.0])}, "disc": {"w": jnp.array([2.0, 0.3])}}
    own = lambda net, other: optim.scoped(  # noqa: E731
        [(f"^{net}/", net), (f"^{other}/", None)], {net: optax.adamw(LR, weight_decay=DECAY)}
    )
    tx = {"gen": own("gen", "disc"), "disc": own("disc", "gen")}
    generator_loss, discriminator_loss = gan_losses()
    step = steps.switch(
        [
            steps.gradient_step(generator_loss, tx["gen"]),
            steps.gradient_step(discriminator_loss, tx["disc"]),
        ],
        lambda state: state.step % 2,  # alternate: generator on even steps
        opt_keys=["gen", "disc"],
    )
    state = fresh_state(params, steps.init_opt_state(tx, params))
    assert not any("disc" in p for p in state_paths(state.opt_state["gen"]))
    assert not any("gen" in p for p in state_paths(state.opt_state["disc"]))
    jitted = jax.jit(step)
    start = state.params
    for i in range(10):
        before = state.params
        state, metrics = jitted(state, None, rng=jax.random.PRNGKey(i))
        state = state.replace(step=state.step + 1)
        moved, idle = ("gen", "disc") if i % 2 == 0 else ("disc", "gen")
        assert int(metrics["branch"]) == i % 2
        assert not np.array_equal(state.params[moved]["w"], before[moved]["w"])
        assert (
            np.asarray(state.params[idle]["w"]).tobytes() == np.asarray(before[idle]["w"]).tobytes()
        )
    for net in ("gen", "disc"):
        assert not np.array_equal(state.params[net]["w"], start[net]["w"])
        # Each named state counts only its own branch's five updates.
        counts = [int(x) for x in jax.tree.leaves(state.opt_state[net]) if x.dtype == jnp.int32]
        assert counts and set(counts) == {5}


def recorder() -> optax.GradientTransformationExtraArgs:
    """A stateful identity whose state is the `value` its last update was given."""

    def update(updates, state, params=None, *, value):
        del params, state
        return updates, jnp.asarray(value, jnp.float32)

    return optax.GradientTransformationExtraArgs(lambda params: jnp.float32(jnp.nan), update)


def test_update_args_reach_the_optimiser_and_opt_metrics_read_its_state():
    params = two_networks()
    inner = optax.chain(optax.sgd(LR), recorder())
    tx = optim.scoped([(r"^encoder/", None), (r"^head/", "head")], {"head": inner})
    step = steps.gradient_step(
        regression,
        tx,
        update_args=lambda value, metrics: {"value": 2 * value + metrics["max_err"]},
        opt_metrics=lambda opt_state: {"seen": opt_state.inner["head"][1]},
    )
    _, metrics = run(step, fresh_state(params, tx.init(params)), 1)
    expected = 2 * metrics["loss"] + metrics["max_err"]  # of the same (initial) params
    assert float(metrics["seen"]) == float(expected)


def plateau_scales(values):
    """reduce_on_plateau's scale after each step whose update was given `values[i]`."""
    params = {"w": jnp.ones(2)}
    tx = optax.chain(
        optax.sgd(LR), optax.contrib.reduce_on_plateau(factor=0.5, patience=2, rtol=0.0, atol=1e-3)
    )
    value_of = iter(values)

    def constant_loss(params, batch, *, rng, extra):
        del batch, rng, extra
        return jnp.sum(params["w"]), {"given": jnp.float32(next(value_of))}

    scales = []
    state = fresh_state(params, tx.init(params))
    for _ in values:  # eager: the loss's metric is a fresh constant each call
        state, metrics = steps.gradient_step(
            constant_loss,
            tx,
            update_args=lambda value, metrics: {"value": metrics["given"]},
            opt_metrics=lambda opt_state: {"scale": opt_state[-1].scale},
        )(state, None, rng=None)
        scales.append(float(metrics["scale"]))
    return scales


def test_reduce_on_plateau_sees_the_given_value():
    """optax halves the scale when its count of steps without improvement reaches patience
    (2): at the third of four equal values; never while the value keeps falling."""
    assert plateau_scales([1.0, 1.0, 1.0, 1.0]) == [1.0, 1.0, 0.5, 0.5]  # stalled
    assert plateau_scales([1.0, 0.9, 0.8, 0.7]) == [1.0, 1.0, 1.0, 1.0]  # improving


@pytest.mark.parametrize(
    "rules, message",
    [
        (
            [(r"^encoder/", None), (r"^head/", "head"), (r"^decoder/", "head")],
            r"^core.optim.scoped: rule '\^decoder/' \(label 'head'\) matches no parameter$",
        ),
        (
            [(r"^encoder/(kernel|bias)$", None), (r"^head/", "head")],
            r"^core.optim.scoped: parameter 'encoder/unused' matches no rule$",
        ),
    ],
)
def test_rules_must_cover_every_parameter_and_each_match_one(rules, message):
    tx = optim.scoped(rules, {"head": optax.sgd(LR)})
    with pytest.raises(ConfigError, match=message):
        steps.init_opt_state(tx, two_networks())


def test_labels_must_name_the_given_optimisers():
    with pytest.raises(
        ConfigError, match=r"rule labels \['head'\] must be the optimisers' \['hed'\]"
    ):
        optim.scoped([(r"^encoder/", None), (r"^head/", "head")], {"hed": optax.sgd(LR)})


# --- phases: one optimiser at a time (a GAN's alternating step) ------------------------------


def two_player_tx():
    return optim.scoped(
        [(r"^encoder/", "enc"), (r"^head/", "head")],
        {"enc": optax.adam(LR), "head": optax.adam(2 * LR)},
    )


def test_a_phase_updates_its_label_only_and_leaves_the_other_state_as_it_was():
    params, tx = two_networks(), two_player_tx()
    state = tx.init(params)
    grads = jax.grad(lambda p: regression(p, batch(), rng=None, extra=None)[0])(params)
    updates, new = tx.phase("head").update(grads, state, params)
    assert all(jnp.all(u == 0) for u in jax.tree.leaves(updates["encoder"]))
    assert all(jnp.all(u != 0) for u in jax.tree.leaves(updates["head"]["kernel"]))
    # The idle optimiser's state is the very same object: no count, no moment decays.
    assert new.inner["enc"] is state.inner["enc"]
    assert int(new.inner["head"][0].count) == 1
    with pytest.raises(ConfigError, match=r"phase labels \['disc'\]"):
        tx.phase("disc")


def test_alternating_phases_equal_two_separate_optimisers():
    """Two phases of one scoped tx (encoder, then head on the encoder just updated) equal two
    optax.adam optimisers run by hand on their halves; zero gradients through the whole tx
    instead (a plausible shortcut) would move the idle half by its Adam momentum."""
    params, tx = two_networks(), two_player_tx()

    def loss(p, b, *, rng, extra):
        return regression(p, b, rng=rng, extra=extra)

    step = jax.jit(steps.alternating_step([("e", ["enc"], loss), ("h", ["head"], loss)], tx))
    state = fresh_state(params, tx.init(params))
    adam_e, adam_h = optax.adam(LR), optax.adam(2 * LR)
    ref, s_e, s_h = params, adam_e.init(params["encoder"]), adam_h.init(params["head"])
    for _ in range(3):
        state, metrics = step(state, batch(), rng=jax.random.PRNGKey(0))
        g = jax.grad(lambda p: loss(p, batch(), rng=None, extra=None)[0])(ref)
        u, s_e = adam_e.update(g["encoder"], s_e)
        ref = {**ref, "encoder": optax.apply_updates(ref["encoder"], u)}
        g = jax.grad(lambda p: loss(p, batch(), rng=None, extra=None)[0])(ref)
        u, s_h = adam_h.update(g["head"], s_h)
        ref = {**ref, "head": optax.apply_updates(ref["head"], u)}
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(ref), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)  # float32, same ops
    assert set(metrics) >= {"e/loss", "e/grad_norm", "h/loss", "h/max_err"}
    assert metrics["h/loss"] < metrics["e/loss"]  # the head's phase saw the updated encoder
