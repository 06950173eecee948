"""The loop's pieces together through `core.train.run`: a profiled, TensorBoard-logging run
traces exactly its chosen steps and mirrors its JSONL; a bad instrument setting stops the run
before anything is written; a scoped, switching, evaluator-bearing run killed after a
checkpoint resumes to the uninterrupted run's state and rows, bitwise."""

import glob
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from core import cache, optim, steps, train, workdir
from core.errors import ConfigError
from core.method import Evaluator, Method
from tests.core.test_evaluators import dataset, sq_error
from tests.core.test_instruments import jsonl_scalars, read_scalars, traced_runs
from tests.core.test_protocol import config, init, mse, one


def test_a_profiled_tensorboard_run_traces_its_steps_and_mirrors_its_metrics(tmp_path):
    method = Method(
        init, loss=mse, dataset=dataset, evaluators=(Evaluator("short", sq_error, split="short"),)
    )
    c = config(4, eval_every=2, profile="2:3", tensorboard=True)
    train.run(c, method, str(tmp_path), devices=one())
    annotated, _ = traced_runs(str(tmp_path))
    assert annotated == {2, 3}
    assert glob.glob(str(tmp_path / "profile/plugins/profile/*/*.xplane.pb"))
    scalars = read_scalars(str(tmp_path / "tensorboard"))
    assert scalars == pytest.approx(jsonl_scalars(str(tmp_path)))
    assert ("eval/short/mse", 4) in scalars


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"profile": "3:9"}, "train.profile=3:9 ends past train.steps=4"),
        ({"profile": "two"}, "train.profile='two' is not first:last"),
    ],
)
def test_a_bad_instrument_setting_writes_nothing(tmp_path, fields, message):
    with pytest.raises(ConfigError, match=message):
        train.run(config(4, **fields), Method(init, loss=mse, dataset=dataset), str(tmp_path / "w"))
    assert not (tmp_path / "w").exists()


def two_network_method():
    """A GAN-shaped run: two networks, each with its own scoped adamw (the other frozen in it),
    alternating by step, two named evaluation streams."""

    def init_two(rng, batch_spec):
        g, d = jax.random.split(rng)
        return {"params": {"gen": {"w": jax.random.normal(g, (4,))}, "disc": {"w": jnp.ones(4)}}}

    def loss(params, batch, *, rng, extra):
        err = batch["x"] @ (params["gen"]["w"] * params["disc"]["w"]) - batch["y"]
        return jnp.mean(err**2), {}

    adamw = optax.adamw(0.05, weight_decay=0.1)
    tx = {
        "gen": optim.scoped([("^gen/", "g"), ("^disc/", None)], {"g": adamw}),
        "disc": optim.scoped([("^disc/", "d"), ("^gen/", None)], {"d": adamw}),
    }
    step = steps.switch(
        [steps.gradient_step(loss, tx["gen"]), steps.gradient_step(loss, tx["disc"])],
        lambda state: state.step % 2,
        opt_keys=("gen", "disc"),
    )

    def error(state, batch, *, rng):
        w = state.params["gen"]["w"] * state.params["disc"]["w"]
        return sq_error(state.replace(params={"w": w}), batch, rng=rng)

    streams = (
        Evaluator("short", error, split="short", every=3),
        Evaluator("long", error, split="long"),
    )
    return Method(init_two, step=step, tx=tx, dataset=dataset, evaluators=streams)


def test_a_killed_scoped_switching_evaluated_run_resumes_bitwise(tmp_path):
    c = config(12, checkpoint_every=4, keep_checkpoints=5, eval_every=0)
    whole = train.run(c, two_network_method(), str(tmp_path / "whole"), devices=one())
    run_dir = tmp_path / "killed"
    train.run(c, two_network_method(), str(run_dir), devices=one())
    for lost in ("8", "12"):  # as if killed after step 4's checkpoint
        shutil.rmtree(run_dir / "checkpoints" / lost)
    resumed = train.run(c, two_network_method(), str(run_dir), devices=one())
    for a, b in zip(jax.tree.leaves(resumed.state), jax.tree.leaves(whole.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    rows = lambda d: [json.loads(r) for r in (d / "metrics.jsonl").read_text().splitlines()]
    assert rows(run_dir) == rows(tmp_path / "whole")  # every train and eval row, once
    assert any("eval/short/mse" in r for r in rows(run_dir) if r["step"] == 9)


def test_instruments_are_no_config_change_and_no_cache_key(tmp_path):
    method = Method(init, loss=mse, dataset=dataset)
    train.run(config(4, checkpoint_every=2), method, str(tmp_path), devices=one())
    # The same run again with a profile and TensorBoard on: accepted, no config change.
    train.run(config(4, checkpoint_every=2, tensorboard=True), method, str(tmp_path))
    before = config(4).to_dict()  # a workdir recorded before the instruments existed
    for field in workdir.INSTRUMENTS:
        section, name = field.split(".")
        del before[section][name]
    assert workdir.config_diff(before, config(4, profile="1:2", tensorboard=True).to_dict()) == []
    assert workdir.config_diff(before, config(5).to_dict()) == ["train.steps: 4 -> 5"]
    key = lambda c: cache.key(c, "code")
    assert key(config(4)) == key(config(4, profile="1:2", tensorboard=True)) == key(before)
    assert key(config(4)) != key(config(5))


@pytest.mark.parametrize(
    "rules, message",
    [
        ([("^w$", "w"), ("^nope/", None)], "rule '\\^nope/' \\(label None\\) matches no parameter"),
        ([("^b$", "w")], "parameter 'w' matches no rule"),
    ],
)
def test_a_scoped_label_error_names_the_method_and_writes_nothing(tmp_path, rules, message):
    tx = optim.scoped(rules, {"w": optax.sgd(0.1)})
    c = config(2)
    c.method = "toy"
    with pytest.raises(ConfigError, match=f"^toy: core.optim.scoped: {message}") as e:
        train.run(c, Method(init, loss=mse, dataset=dataset, tx=tx), str(tmp_path / "w"))
    assert "\n" not in str(e.value) and not (tmp_path / "w").exists()
