"""The researcher's instruments: a profiler trace of chosen steps (core.profile), TensorBoard
scalars beside the JSONL (core.metrics), and a jitted train step that makes no implicit host
transfer (jax.transfer_guard)."""

import glob
import io
import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

import methods
from configs import dupa, lm, nab
from core import metrics, profile, train
from core.errors import ConfigError
from core.metrics import MetricsLogger

# ---- profiler ----------------------------------------------------------------------------


@jax.jit
def toy_step(x_NN):
    # A few chained matmuls: enough device work per step (tens of ms) that a trace stopped
    # without waiting for the last step would miss it.
    for _ in range(8):
        x_NN = jnp.tanh(x_NN @ x_NN) * 0.5
    return x_NN


def profiled_loop(spec, steps, workdir, fail_at=None):
    profiler = profile.StepProfiler(spec, steps, workdir)
    x_NN = jnp.ones((512, 512)) * 0.01
    jax.block_until_ready(toy_step(x_NN))  # compiled outside the trace
    try:
        for step in range(1, steps + 1):
            profiler.before(step)
            x_NN = toy_step(x_NN)
            if step == fail_at:
                raise RuntimeError("the run failed")
            profiler.after(step, x_NN)
            if profiler.range and step < profiler.range[0]:
                # So no earlier step's device work runs on into the trace: the executions in
                # it are then exactly the profiled steps'.
                jax.block_until_ready(x_NN)
    finally:
        profiler.close()


def traced_runs(workdir):
    """(step numbers annotated, distinct executions of toy_step) in the one xplane written."""
    (path,) = glob.glob(os.path.join(workdir, "profile/plugins/profile/*/*.xplane.pb"))
    annotated, executions = set(), set()
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        for line in plane.lines:
            for event in line.events:
                stats = dict(event.stats)
                if event.name == "train" and "step_num" in stats:
                    annotated.add(stats["step_num"])
                if stats.get("hlo_module") == "jit_toy_step":
                    executions.add(stats["run_id"])  # one id per execution of the program
    return annotated, executions


def test_profile_traces_exactly_the_chosen_steps_with_their_device_work(tmp_path):
    profiled_loop("2:3", 4, str(tmp_path))
    annotated, executions = traced_runs(str(tmp_path))
    assert annotated == {2, 3}
    # Steps 2 and 3 ran on the device inside the trace (step 3's too: it was waited for),
    # steps 1 and 4 outside it.
    assert len(executions) == 2
    assert glob.glob(str(tmp_path / "profile/plugins/profile/*/*.trace.json.gz"))  # Perfetto


def test_profile_stops_the_trace_of_a_run_that_fails_inside_the_range(tmp_path):
    with pytest.raises(RuntimeError, match="the run failed"):
        profiled_loop("2:3", 4, str(tmp_path), fail_at=2)
    annotated, _ = traced_runs(str(tmp_path))
    assert annotated == {2}
    profiled_loop("1:1", 1, str(tmp_path / "again"))  # no trace was left running


def test_profile_that_cannot_be_written_does_not_end_the_run(tmp_path):
    # In a child process: jax keeps counting a trace whose export failed as running, which would
    # refuse every later trace in this one.
    (tmp_path / "profile").write_text("a file where the trace folder should be")
    script = (
        "from tests.core import test_instruments as t; "
        f"t.profiled_loop('1:2', 3, {str(tmp_path)!r}); print('the run went on')"
    )
    child = subprocess.run(
        [sys.executable, "-c", script],
        cwd=pathlib.Path(__file__).parents[2],  # the repository root: `tests` imports from it
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    assert "the run went on" in child.stdout
    assert "profile of steps 1:2 not written to" in child.stderr


def test_profile_off_and_on_other_processes_writes_nothing(tmp_path):
    profiled_loop("", 3, str(tmp_path / "off"))
    profiler = profile.StepProfiler("1:2", 3, str(tmp_path / "other"), write=False)
    for step in (1, 2, 3):
        profiler.before(step)
        profiler.after(step, jnp.zeros(()))
    profiler.close()
    assert not (tmp_path / "off" / "profile").exists()
    assert not (tmp_path / "other" / "profile").exists()


@pytest.mark.parametrize(
    "spec, message",
    [
        ("5", "lm: train.profile='5' is not first:last"),
        ("a:b", "lm: train.profile='a:b' is not first:last"),
        ("3:", "lm: train.profile='3:' is not first:last"),
        ("0:2", "lm: train.profile=0:2 starts before step 1"),
        ("4:2", "lm: train.profile=4:2 has first step 4 after last 2"),
        ("5:20", "lm: train.profile=5:20 ends past train.steps=10"),
    ],
)
def test_profile_spec_errors_are_one_line(spec, message):
    with pytest.raises(ConfigError) as error:
        profile.parse(spec, 10, method="lm")
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_profile_spec_accepts_ranges_inside_the_run():
    assert profile.parse("", 10) is None
    assert profile.parse("1:10", 10) == (1, 10)
    assert profile.parse(" 3:3 ", 10) == (3, 3)


# ---- TensorBoard -------------------------------------------------------------------------


def read_events(directory):
    """Every Event in the event files under `directory`, parsed from the TFRecord framing
    (length, its crc, the Event proto, its crc) by hand."""
    events = []
    for path in glob.glob(os.path.join(directory, "events.out.tfevents.*")):
        data = pathlib.Path(path).read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = np.frombuffer(data[offset : offset + 8], "<u8")
            events.append(event_pb2.Event.FromString(data[offset + 12 : offset + 12 + int(length)]))
            offset += 12 + int(length) + 4
    return events


def read_scalars(directory):
    """{(tag, step): value} of every scalar written under `directory`."""
    scalars = {}
    for event in read_events(directory):
        for value in event.summary.value:
            assert (value.tag, event.step) not in scalars, "a scalar written twice"
            scalars[value.tag, event.step] = value.simple_value
    return scalars


def jsonl_scalars(workdir):
    lines = pathlib.Path(workdir, "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return {(k, row["step"]): v for row in rows for k, v in row.items() if k != "step"}


def log_rows(workdir, tensorboard_dir, write=True, resume_step=0, steps=(1, 2, 3, 4)):
    logger = MetricsLogger(
        workdir,
        total_steps=4,
        global_batch=8,
        log_every=2,
        write=write,
        stream=io.StringIO(),
        tensorboard_dir=tensorboard_dir,
        tensorboard_resume_step=resume_step,
    )
    for step in steps:
        # A NaN metric is "not measured": left out of the JSONL row, so out of TensorBoard too.
        accuracy = np.nan if step == 3 else 0.5 + step / 10
        logger.push(step, {"loss": jnp.float32(1.0 / step), "accuracy": jnp.float32(accuracy)})
        if step == 2:
            logger.flush()
            logger.log_eval(2, {"accuracy": jnp.float32(0.75)})
    logger.close()


def test_tensorboard_scalars_equal_the_jsonl_rows(tmp_path):
    log_rows(str(tmp_path), str(tmp_path / "tensorboard"))
    expected = jsonl_scalars(str(tmp_path))
    assert ("eval/accuracy", 2) in expected and ("accuracy", 3) not in expected
    got = read_scalars(str(tmp_path / "tensorboard"))
    assert set(got) == set(expected)
    for key, value in expected.items():
        # Event files hold float32 scalars: the JSONL's float64 rounded once.
        np.testing.assert_allclose(got[key], value, rtol=1e-6, err_msg=str(key))


def test_tensorboard_is_off_by_default_and_on_other_processes(tmp_path):
    (tmp_path / "off").mkdir()
    log_rows(str(tmp_path / "off"), None)
    log_rows(None, str(tmp_path / "other"), write=False)
    assert not glob.glob(str(tmp_path / "**/events.out.tfevents.*"), recursive=True)


def test_tensorboard_resumed_run_hides_the_rows_after_its_checkpoint(tmp_path):
    log_rows(None, str(tmp_path), resume_step=2, steps=(3, 4))
    events = read_events(str(tmp_path))
    # TensorBoard drops the events of steps >= a START session log's step written before it:
    # the first run's rows after its checkpoint at step 2, which the resumed run writes again.
    starts = [e.step for e in events if e.session_log.status == event_pb2.SessionLog.START]
    assert starts == [3]
    assert {step for _, step in read_scalars(str(tmp_path))} == {3, 4}


def test_tensorboard_dir_follows_the_config_and_refuses_a_bucket(tmp_path):
    config = lm.get_config("size=smoke")
    assert metrics.tensorboard_dir(config, str(tmp_path)) is None  # off by default
    config.train.tensorboard = True
    assert metrics.tensorboard_dir(config, str(tmp_path)) == tmp_path / "tensorboard"
    with pytest.raises(ConfigError, match="^lm: train.tensorboard=True needs a local workdir"):
        metrics.tensorboard_dir(config, "gs://bucket/run")


def test_tensorboard_refuses_a_bucket_before_writing(tmp_path):
    with pytest.raises(ConfigError, match="train.tensorboard: event files are written to a local"):
        log_rows(str(tmp_path), "gs://bucket/run/tensorboard", write=False)


# ---- no implicit host transfer in a train step -------------------------------------------


def smoke(module, arg="size=smoke"):
    return module.get_config(arg)


def guarded_steps(config, batch_transform=lambda batch: batch, steps=3):
    """`steps` train steps of `config`'s method, each under transfer_guard("disallow"); the
    batch is placed on the devices before, outside the guard, as the loop does."""
    session = train.init(config, methods.make(config))
    state = session.state
    for _ in range(steps):
        batch = batch_transform(session.next_batch())
        with jax.transfer_guard("disallow"):
            state, metrics = session.step(state, batch)
    return jax.device_get(metrics)


@pytest.mark.parametrize("config", [smoke(lm), smoke(dupa), smoke(nab)], ids=["lm", "dupa", "nab"])
def test_train_step_makes_no_implicit_host_transfer(config):
    metrics = guarded_steps(config)
    assert np.isfinite(metrics["loss"])


def test_transfer_guard_catches_a_host_batch():
    """The guard is live: a numpy batch (a host value passed per call) is refused."""
    with pytest.raises(Exception, match="[Dd]isallowed host-to-device transfer"):
        guarded_steps(smoke(lm), batch_transform=jax.device_get, steps=1)
