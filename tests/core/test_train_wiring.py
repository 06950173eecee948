"""The loop's instruments and checks wired through `core.train.run`: a profiled, TensorBoard-
logging run traces exactly its chosen steps and mirrors its JSONL; a bad instrument setting
stops the run before anything is written."""

import glob

import pytest

from core import train
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
