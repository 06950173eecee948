"""Surviving faults: SIGKILL and exact resume, SIGTERM preemption, damaged checkpoints,
workdir/config safety. The kill tests drive `python -m launch.train` as a user's job would."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from orbax.checkpoint._src.path import atomicity

import methods
from core import cache, preemption, train
from core import workdir as workdir_lib
from core.checkpoint import DAMAGED, MANIFEST, Checkpointer, DamagedCheckpointWarning
from core.errors import ConfigError
from tests.core.test_train import lm_config

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The property is "resume == uninterrupted, bitwise", not a step count: five checkpoint intervals
# hold three kills, each one interval past where its attempt resumed (1500 steps cost ~3x more).
STEPS, EVERY = 500, 100
ARGS = [
    "--config=configs/lm.py:size=smoke,task=copy,mesh=cpu",
    f"--config.train.steps={STEPS}",
    f"--config.train.checkpoint_every={EVERY}",
    "--config.train.log_every=500",
    "--config.train.eval_every=-1",
    "--config.task.length=8",
]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"}


def start(workdir) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "launch.train", *ARGS, f"--workdir={workdir}"]
    return subprocess.Popen(
        cmd, cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def last_step(workdir) -> int:
    try:
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return 0
    for line in reversed(lines):
        try:
            return json.loads(line)["step"]
        except ValueError:
            continue  # a partial line being written
    return 0


def run_until(workdir, step: int, sig: int, timeout: float = 120) -> tuple[int, str]:
    """Start the job, send `sig` once it has logged `step`; return (returncode, output)."""
    proc = start(workdir)
    try:
        deadline = time.monotonic() + timeout
        while last_step(workdir) < step:
            assert proc.poll() is None, f"finished before step {step}:\n{proc.stdout.read()}"
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.005)
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_to_end(workdir) -> str:
    proc = start(workdir)
    try:
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out
    return out


def losses(workdir) -> list[tuple[int, float]]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def final_params(workdir):
    path = os.path.join(workdir, "checkpoints", str(STEPS), "state")
    return ocp.StandardCheckpointer().restore(path)["params"]


def assert_bitwise_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("uninterrupted")
    run_to_end(workdir)
    return workdir


def test_three_sigkills_lose_nothing(tmp_path, uninterrupted):
    rng = random.Random(0)
    workdir = tmp_path / "killed"
    kills = []
    for _ in range(3):
        resume_from = Checkpointer(str(workdir / "checkpoints")).latest_step() or 0
        # A random step in the interval after this attempt's first new checkpoint: each attempt
        # saves something, and is killed past where the previous one was.
        target = resume_from + EVERY + rng.randint(1, EVERY - 1)
        code, out = run_until(workdir, target, signal.SIGKILL)
        assert code == -signal.SIGKILL, out
        if resume_from:
            assert f"resumed from {workdir / 'checkpoints'}/{resume_from}" in out
        kills.append(last_step(workdir))
    assert kills == sorted(kills)
    run_to_end(workdir)
    # Same data order and per-step randomness: bitwise the uninterrupted run.
    assert losses(workdir) == losses(uninterrupted)
    assert_bitwise_equal(final_params(workdir), final_params(uninterrupted))


def test_sigterm_checkpoints_the_current_step_and_exits_cleanly(tmp_path, uninterrupted):
    workdir = tmp_path / "preempted"
    code, out = run_until(workdir, 2 * EVERY + 37, signal.SIGTERM)
    assert code == 0, out
    stopped = int(out.split("checkpoint saved at step ")[1].split(";")[0])
    assert stopped > 2 * EVERY + 37 and stopped % EVERY  # not a regular checkpoint step
    assert Checkpointer(str(workdir / "checkpoints")).latest_step() == stopped
    out = run_to_end(workdir)
    assert f"resumed from {workdir / 'checkpoints'}/{stopped}" in out
    assert losses(workdir) == losses(uninterrupted)
    assert_bitwise_equal(final_params(workdir), final_params(uninterrupted))


def short_config():
    config = lm_config(steps=12)
    config.train.checkpoint_every = 4
    config.train.keep_checkpoints = 3
    return config


def damage(step_dir, how: str) -> None:
    files = [
        os.path.join(root, f)
        for root, _, names in os.walk(step_dir)
        for f in names
        if f != MANIFEST
    ]
    victim = max(files, key=os.path.getsize)  # the array data
    if how == "truncate":
        with open(victim, "r+b") as f:
            f.truncate(os.path.getsize(victim) // 2)
    else:
        with open(victim, "r+b") as f:
            f.seek(os.path.getsize(victim) // 2)
            f.write(b"\x5a" * 16)


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One `short_config` run (checkpoints at 4, 8, 12) and its workdir, trained once: the tests
    that damage checkpoints each damage a copy (the same files a run of their own would write)."""
    workdir = tmp_path_factory.mktemp("short") / "run"
    config = short_config()
    return train.run(config, methods.make(config), str(workdir)), workdir


@pytest.mark.parametrize("how", ["truncate", "garble"])
def test_damaged_latest_checkpoint_falls_back_to_the_previous(tmp_path, how, short_run):
    config = short_config()
    full, full_workdir = short_run
    workdir = tmp_path / "damaged"
    shutil.copytree(full_workdir, workdir)
    ckpt_dir = workdir / "checkpoints"
    damage(ckpt_dir / "12", how)

    # Orbax alone does not always notice: with the digests removed, a step truncated this way
    # was once restored without any error. The digests catch both kinds of damage.
    match = "checkpoint step 12 .* damaged .*differ from their digest"
    with pytest.warns(DamagedCheckpointWarning, match=match):
        resumed = train.run(config, methods.make(config), str(workdir))
    assert [r["step"] for r in resumed.history if "loss" in r] == [9, 10, 11, 12]
    assert_bitwise_equal(resumed.state.params, full.state.params)
    # The damaged step is kept for inspection, not deleted.
    assert len(os.listdir(workdir / DAMAGED)) == 1


def test_a_run_killed_before_its_first_checkpoint_restarts_its_metrics(tmp_path, short_run):
    # As if the first save had not committed when the job died: metrics rows, no checkpoint.
    config = short_config()
    workdir = tmp_path / "early"
    shutil.copytree(short_run[1], workdir)
    shutil.rmtree(workdir / "checkpoints")
    train.run(config, methods.make(config), str(workdir))
    assert [step for step, _ in losses(workdir)] == list(range(1, 13))
    assert losses(workdir) == losses(short_run[1])


def test_no_good_checkpoint_is_a_clear_error(tmp_path, short_run):
    config = short_config()
    workdir = tmp_path / "damaged"
    shutil.copytree(short_run[1], workdir)
    for step in (4, 8, 12):
        damage(workdir / "checkpoints" / str(step), "garble")
    with pytest.warns(DamagedCheckpointWarning), pytest.raises(ConfigError) as e:
        train.run(config, methods.make(config), str(workdir))
    assert "no usable checkpoint" in str(e.value) and "\n" not in str(e.value)


def test_a_good_checkpoint_survives_until_its_successor_is_committed(tmp_path, monkeypatch):
    config = short_config()
    config.train.keep_checkpoints = 1
    config.train.steps = 8
    train.run(config, methods.make(config), str(tmp_path / "a"))
    assert sorted(os.listdir(tmp_path / "a" / "checkpoints")) == ["8"]

    # Now every save dies before orbax commits it (as if the process were killed mid-save):
    # the step that was there stays, though keep_checkpoints=1 and newer steps were written.
    async def dies(self):
        raise RuntimeError("killed before the commit")

    monkeypatch.setattr(atomicity.AtomicRenameTemporaryPath, "finalize", dies)
    config.train.steps = 16
    with pytest.raises(RuntimeError, match="killed before the commit"):
        train.run(config, methods.make(config), str(tmp_path / "a"), allow_config_change=True)
    steps = [p for p in os.listdir(tmp_path / "a" / "checkpoints") if p.isdigit()]
    assert steps == ["8"]
    assert Checkpointer(str(tmp_path / "a" / "checkpoints")).verify(8) is None


def test_sealed_steps_carry_digests_and_old_steps_are_pruned(tmp_path):
    config = short_config()  # checkpoints at 4, 8, 12; keep 3 -> all; keep 2 -> 8, 12
    config.train.keep_checkpoints = 2
    train.run(config, methods.make(config), str(tmp_path))
    ckpt_dir = tmp_path / "checkpoints"
    assert sorted(os.listdir(ckpt_dir)) == ["12", "8"]
    for step in (8, 12):
        digests = json.loads((ckpt_dir / str(step) / MANIFEST).read_text())
        assert any(name.startswith("state/") for name in digests)
        assert Checkpointer(str(ckpt_dir)).verify(step) is None


def test_workdir_with_another_config_is_refused(tmp_path):
    config = short_config()
    config.train.checkpoint_every = 0
    train.run(config, methods.make(config), str(tmp_path))
    changed = short_config()
    changed.train.checkpoint_every = 0
    changed.optim.lr = 0.5
    changed.task.length = 9
    with pytest.raises(ConfigError) as e:
        train.run(changed, methods.make(changed), str(tmp_path))
    message = str(e.value)
    assert "\n" not in message
    assert "optim.lr: 0.001 -> 0.5" in message and "task.length: 8 -> 9" in message
    train.run(changed, methods.make(changed), str(tmp_path), allow_config_change=True)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["optim"]["lr"] == 0.5
    assert len(os.listdir(tmp_path / "runs")) == 2  # the config of every run is kept


def test_runs_started_in_one_second_keep_a_record_each(tmp_path, monkeypatch):
    # Three starts in one second of one process, all drawing the same token: the count of
    # that second's records alone must keep their names apart (and in start order). On gs://
    # the same epath calls run (tests/core/test_gcs_workdir.py counts a resume's two records).
    monkeypatch.setattr(time, "strftime", lambda fmt, *t: "20261204-201500")
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=7))
    configs = [{"run": i} for i in range(3)]
    for config in configs:
        workdir_lib.check_and_record_config(tmp_path, config, allow_change=True, write=True)
    names = sorted(os.listdir(tmp_path / "runs"))
    assert [json.loads((tmp_path / "runs" / n).read_text()) for n in names] == configs, names
    assert all(name.startswith("20261204-201500-") for name in names)


def test_config_json_garbage_is_a_clear_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    config = short_config()
    with pytest.raises(ConfigError, match="config.json is not valid JSON"):
        train.run(config, methods.make(config), str(tmp_path))
    shutil.rmtree(tmp_path)


def test_a_preempted_run_is_not_cached_as_finished_and_the_rerun_resumes_it(tmp_path, monkeypatch):
    # The process-wide mark starts clear here and is restored after the test.
    monkeypatch.setattr(preemption, "_PREEMPTED", threading.Event())
    config = lm_config(steps=8)
    method = methods.make(config)

    def sigterm_at_step_3(state, *, step):
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # what a scheduler sends; the run's handler has it

    def train_once(method):
        result = train.run(config, method, tmp_path / "run")
        # What an experiment does next (read the last evaluation, evaluate more): inside the
        # cache a preempted run raises before this line, so no post-processing sees it.
        assert not result.preempted, "the caller's code ran on a cut-short run"
        return {"steps": int(result.state.step)}

    root = str(tmp_path / "cache")
    with pytest.raises(preemption.Preempted, match="rerun to continue"):
        cache.cached(
            lambda: train_once(method._replace(hook=sigterm_at_step_3)),
            config=config,
            code="c",
            root=root,
        )
    assert cache.entries(root) == []  # the cut-short run (3 of 8 steps) was not stored
    assert Checkpointer(str(tmp_path / "run" / "checkpoints")).latest_step() == 3
    monkeypatch.setattr(preemption, "_PREEMPTED", threading.Event())  # a fresh process
    assert cache.cached(lambda: train_once(method), config=config, code="c", root=root) == {
        "steps": 8
    }
    assert [e["value"] for e in cache.entries(root)] == [{"steps": 8}]
