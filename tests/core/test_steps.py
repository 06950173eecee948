"""core.steps combinators and core.optim schedules."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from configs.common import base_config
from core import optim
from core.errors import ConfigError
from core.state import TrainState
from core.steps import gradient_step, microbatched, with_ema, with_schedules


def mse(params, batch, *, rng, extra):
    del rng, extra
    err_B = batch["x"] @ params["w"] - batch["y"]
    return jnp.mean(err_B**2), {"num_tokens": jnp.float32(err_B.size), "max": jnp.max(err_B)}


def data():
    x = jax.random.normal(jax.random.PRNGKey(0), (16, 3))
    return {"x": x, "y": x @ jnp.array([1.0, -2.0, 0.5])}, {"w": jnp.array([0.3, 0.1, -0.2])}


def test_microbatched_gradient_equals_the_full_batch_gradient():
    batch, params = data()
    rng = jax.random.PRNGKey(1)
    full = jax.grad(lambda p: mse(p, batch, rng=rng, extra={})[0])(params)
    loss4 = microbatched(mse, 4)
    value4, metrics4 = loss4(params, batch, rng=rng, extra={})
    grad4 = jax.grad(lambda p: loss4(p, batch, rng=rng, extra={})[0])(params)
    # Equal-size microbatches: the mean of means is the mean; float32 summation order only.
    np.testing.assert_allclose(grad4["w"], full["w"], rtol=1e-5)
    np.testing.assert_allclose(value4, mse(params, batch, rng=rng, extra={})[0], rtol=1e-6)
    assert float(metrics4["num_tokens"]) == 16  # counts add up, they are not averaged


def test_microbatches_must_divide_the_batch():
    batch, params = data()
    with pytest.raises(ConfigError, match="not divisible into 5 microbatches"):
        microbatched(mse, 5)(params, batch, rng=jax.random.PRNGKey(0), extra={})


def test_gradient_step_applies_the_optimizer_and_ema_tracks_the_params():
    batch, params = data()
    tx = optax.sgd(0.1)
    state = TrainState(
        step=jnp.int32(0),
        rng=jax.random.PRNGKey(0),
        params=params,
        opt_state=tx.init(params),
        extra={"ema": params},
    )
    step = with_ema(gradient_step(mse, tx), decay=0.9)
    new, metrics = step(state, batch, rng=jax.random.PRNGKey(2))
    grad = jax.grad(lambda p: mse(p, batch, rng=None, extra={})[0])(params)
    expected = params["w"] - 0.1 * grad["w"]
    np.testing.assert_allclose(new.params["w"], expected, rtol=1e-6)
    np.testing.assert_allclose(new.extra["ema"]["w"], 0.9 * params["w"] + 0.1 * expected, rtol=1e-6)
    assert set(metrics) >= {"loss", "grad_norm", "max"}


@pytest.mark.parametrize("n, expected_decay", [(0, 0.1), (90, 0.91), (10_000, 0.99)])
def test_ema_warmup_decay_follows_the_update_count(n, expected_decay):
    """With warmup the decay after n updates is min(decay, (1 + n) / (10 + n)): 0.1 at the
    first step (the EMA mostly the new params), the configured decay late in a run."""
    batch, params = data()
    tx = optax.sgd(0.1)
    ema0 = {"w": jnp.zeros(3)}
    state = TrainState(jnp.int32(n), jax.random.PRNGKey(0), params, tx.init(params), {"ema": ema0})
    new, _ = with_ema(gradient_step(mse, tx), decay=0.99, warmup=True)(
        state, batch, rng=jax.random.PRNGKey(2)
    )
    # float32 arithmetic on values of order 1.
    np.testing.assert_allclose(
        new.extra["ema"]["w"], (1 - expected_decay) * new.params["w"], rtol=1e-5
    )


def test_with_schedules_shows_the_loss_a_function_of_the_step_without_keeping_it():
    """The loss sees extra["scale"] = schedule(state.step) (here it scales the targets, so the
    gradient depends on it); the returned state's extra is the input's; the value is logged."""
    batch, params = data()
    tx = optax.sgd(0.1)

    def scaled_mse(params, batch, *, rng, extra):
        return mse(params, {**batch, "y": extra["scale"] * batch["y"]}, rng=rng, extra=extra)

    state = TrainState(
        step=jnp.int32(3),
        params=params,
        rng=jax.random.PRNGKey(0),
        opt_state=tx.init(params),
        extra={"kept": jnp.ones(2)},
    )
    step = with_schedules(gradient_step(scaled_mse, tx), {"scale": lambda s: 0.5 * s})
    new, metrics = step(state, batch, rng=jax.random.PRNGKey(2))
    grad = jax.grad(lambda p: mse(p, {**batch, "y": 1.5 * batch["y"]}, rng=None, extra={})[0])
    np.testing.assert_allclose(new.params["w"], params["w"] - 0.1 * grad(params)["w"], rtol=1e-6)
    assert set(new.extra) == {"kept"} and float(metrics["scale"]) == 1.5


def test_schedule_warms_up_then_decays():
    config = base_config().optim
    config.lr, config.warmup_steps, config.schedule = 1.0, 10, "cosine"
    config.final_lr_fraction = 0.1
    lr = optim.schedule(config, total_steps=110)
    assert float(lr(0)) == 0.0 and float(lr(5)) == pytest.approx(0.5)
    assert float(lr(10)) == pytest.approx(1.0)
    assert float(lr(60)) == pytest.approx(0.55, rel=1e-5)  # half-way down the cosine
    assert float(lr(110)) == pytest.approx(0.1)


def test_unknown_optimizer_is_a_config_error():
    config = base_config().optim
    config.name = "adamz"
    with pytest.raises(ConfigError, match="optim.name='adamz' is unknown"):
        optim.make(config, 10)


def test_logger_console_shows_the_mean_since_the_last_line_and_jsonl_every_step(tmp_path):
    import io
    import json

    from core.metrics import MetricsLogger

    stream = io.StringIO()
    logger = MetricsLogger(str(tmp_path), total_steps=4, global_batch=1, log_every=2, stream=stream)
    steps = [(1, 1.0, 5.0), (2, 3.0, float("nan")), (3, 10.0, 1.0), (4, 20.0, 3.0)]
    for step, loss, reward in steps:
        logger.push(step, {"loss": loss, "reward": reward})
    logger.close()
    lines = stream.getvalue().splitlines()
    # Step 2's line: loss (1 + 3) / 2; reward only measured at step 1. Step 4's: a fresh window.
    assert "loss 2 |" in lines[0] and "reward 5 |" in lines[0], lines[0]
    assert "loss 15 |" in lines[1] and "reward 2 |" in lines[1], lines[1]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [row["loss"] for row in rows] == [1.0, 3.0, 10.0, 20.0]


def test_logger_leaves_out_nan_metrics_but_stops_on_a_nan_loss(tmp_path):
    import io
    import json

    from core.metrics import MetricsLogger, NonFiniteLossError

    stream = io.StringIO()
    logger = MetricsLogger(str(tmp_path), total_steps=3, global_batch=1, log_every=1, stream=stream)
    logger.push(1, {"loss": 1.0, "reward": float("nan"), "branch": 0.0})  # a switch step
    logger.push(2, {"loss": 0.5, "reward": 2.0, "branch": 1.0})
    logger.flush()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert "reward" not in rows[0] and rows[1]["reward"] == 2.0
    logger.log_eval(2, {"auroc": float("nan"), "accuracy": 1.0})  # AUROC of one class
    assert logger.history[-1] == {"step": 2, "eval/accuracy": 1.0}
    assert "nan" not in stream.getvalue()
    logger.push(3, {"loss": float("nan")})
    with pytest.raises(NonFiniteLossError, match="at step 3"):
        logger.flush()
    logger.close()
