"""A gs:// workdir really goes to the bucket: train, SIGKILL and resume there, bitwise the same as
a local run, with nothing written to the local disk. The bucket is `tests.core.fake_gcs`: a local
folder behind fsspec's "gs" filesystem (epath) and a GCS JSON API (tensorstore), so the code
under test takes the same path as on a real bucket."""

import builtins
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

import methods
from core import storage, train
from core.checkpoint import DAMAGED, MANIFEST, Checkpointer, DamagedCheckpointWarning
from core.errors import ConfigError
from tests.core import fake_gcs
from tests.core.test_faults import ENV, REPO, damage
from tests.core.test_train import lm_config

STEPS, EVERY = 200, 40
ARGS = [
    f"--config={REPO}/configs/lm.py:size=smoke,task=copy,mesh=cpu",
    f"--config.train.steps={STEPS}",
    f"--config.train.checkpoint_every={EVERY}",
    "--config.train.log_every=10",
    "--config.train.eval_every=-1",
    "--config.task.length=8",
]


@pytest.fixture(scope="module")
def bucket(tmp_path_factory):
    """(backing folder, API url) of a fake gs://bucket, installed in this process too (one per
    module: tensorstore keeps the first URL it was given)."""
    root = tmp_path_factory.mktemp("gcs")
    (root / "bucket").mkdir()
    server, url = fake_gcs.serve(str(root))
    fake_gcs.install(str(root), url)
    yield root, url
    server.shutdown()


def start(workdir: str, cwd, bucket) -> subprocess.Popen:
    root, url = bucket
    env = {**ENV, "PYTHONPATH": REPO, "FAKE_GCS_ROOT": str(root)}
    env |= {"TENSORSTORE_GCS_HTTP_URL": url, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake"}
    cmd = [sys.executable, "-m", "tests.core.fake_gcs", "launch.train", *ARGS]
    return subprocess.Popen(
        [*cmd, f"--workdir={workdir}"],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def rows(workdir: epath.Path) -> list[dict]:
    path = workdir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def final_params(workdir: epath.Path):
    return ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(STEPS) / "state")[
        "params"
    ]


@pytest.mark.slow  # three jobs (one killed): 40-70 s on 2 shared cores
def test_train_sigkill_resume_on_gs_matches_a_local_run(tmp_path, bucket):
    cwd = tmp_path / "cwd"  # the jobs run here: a gs:// path written locally would show up
    cwd.mkdir()
    local = tmp_path / "local"
    gs = epath.Path("gs://bucket/runs/lm")
    reference = start(str(local), cwd, bucket)
    killed = start(str(gs), cwd, bucket)
    try:
        deadline = time.monotonic() + 120
        while not rows(gs) or rows(gs)[-1]["step"] < 2 * EVERY + 15:  # past 2 checkpoints
            assert killed.poll() is None, killed.stdout.read()
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.01)
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        logged = rows(gs)[-1]["step"]
        # The newest committed step (a save still uploading when killed is not committed).
        resume_from = Checkpointer(gs / "checkpoints").latest_step()
        assert resume_from is not None and EVERY <= resume_from < logged
        resumed = start(str(gs), cwd, bucket)
        out, _ = resumed.communicate(timeout=120)
        assert resumed.returncode == 0, out
        assert f"resumed from {gs}/checkpoints/{resume_from}" in out
        reference_out, _ = reference.communicate(timeout=120)
        assert reference.returncode == 0, reference_out
    finally:
        for proc in (reference, killed):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    local_rows = rows(epath.Path(local))
    assert [r["step"] for r in rows(gs)] == list(range(1, STEPS + 1))
    assert rows(gs) == local_rows  # bitwise the same losses as the local, uninterrupted run
    for a, b in zip(
        jax.tree.leaves(final_params(gs)),
        jax.tree.leaves(final_params(epath.Path(local))),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # Orbax pruned to keep_checkpoints (2) committed, sealed steps; all of it in the bucket.
    step_dirs = sorted((gs / "checkpoints").iterdir(), key=lambda p: int(p.name))
    assert [p.name for p in step_dirs] == [str(STEPS - EVERY), str(STEPS)]
    assert all((p / MANIFEST).exists() and (p / "commit_success.txt").exists() for p in step_dirs)
    assert os.listdir(cwd) == []


@pytest.fixture
def no_local_gs_paths(monkeypatch):
    """Any local file operation on a path naming gs: fails the test."""

    def guarded(function):
        def call(*args, **kwargs):
            for arg in args[:2]:
                if isinstance(arg, str | os.PathLike) and "gs:" in os.fspath(arg):
                    raise AssertionError(f"local {function.__name__} on {os.fspath(arg)}")
            return function(*args, **kwargs)

        return call

    monkeypatch.setattr(builtins, "open", guarded(builtins.open))
    for name in ("makedirs", "mkdir", "replace", "rename", "remove", "unlink", "listdir"):
        monkeypatch.setattr(os, name, guarded(getattr(os, name)))
    monkeypatch.setattr(shutil, "rmtree", guarded(shutil.rmtree))


def test_gs_workdir_resume_and_damage_never_touch_the_local_disk(
    tmp_path, bucket, monkeypatch, no_local_gs_paths
):
    monkeypatch.chdir(tmp_path)
    config = lm_config(steps=12)
    config.train.checkpoint_every = 4
    config.train.keep_checkpoints = 3
    workdir = "gs://bucket/w"
    train.run(config, methods.make(config), workdir)
    gs = epath.Path(workdir)
    assert sorted(p.name for p in (gs / "checkpoints").iterdir()) == ["12", "4", "8"]

    # Resuming past a damaged newest step: it is moved aside (kept), step 8 is restored, the
    # metrics rows after it are rewound and written again.
    damage(bucket[0] / "bucket" / "w" / "checkpoints" / "12", "garble")
    with pytest.warns(DamagedCheckpointWarning, match="step 12 .* differ from their digest"):
        resumed = train.run(config, methods.make(config), workdir)
    assert [r["step"] for r in resumed.history if "loss" in r] == [9, 10, 11, 12]
    assert [r["step"] for r in rows(gs)] == list(range(1, 13))
    assert len(list((gs / DAMAGED).iterdir())) == 1
    assert len(list((gs / "runs").iterdir())) == 2  # the config of every start
    assert os.listdir(tmp_path) == []  # the current directory: nothing written locally


def test_unsupported_scheme_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="only a local path or gs://") as e:
        storage.prepare_workdir("s3://bucket/run")
    assert "\n" not in str(e.value)


def test_outputs_written_with_local_tools_refuse_a_bucket(tmp_path, monkeypatch):
    from launch import bench, reproduce

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="--out 'gs://bucket/out' must be a local folder"):
        reproduce.reproduce(["lm"], "gs://bucket/out", quick=True)
    with pytest.raises(ConfigError, match="--out 'gs://bucket/b' must be a local folder"):
        bench.run(["lm"], "gs://bucket/b", smoke=True)
    assert os.listdir(tmp_path) == []
