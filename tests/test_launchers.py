"""The Slurm launcher: its dry-run output, what jax.distributed derives from the variables srun
sets for its geometry, and a run under a stand-in srun; the Python entry points' one-line errors
for bad config input. launch/tpu_vm.sh: tests/test_tpu_vm.py."""

import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
from unittest import mock

import pytest

from configs.common import mesh_config
from core.mesh import make_mesh
from tests.core.test_mesh import FakeDevice

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def dry(*args, env=None) -> list[list[str]]:
    """Run a launcher and parse each printed '+ cmd' line back into its argv."""
    out = subprocess.run(
        ["bash", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )
    assert out.returncode == 0, out.stderr
    return [shlex.split(line[2:]) for line in out.stdout.splitlines() if line.startswith("+ ")]


def test_slurm_script_runs_one_multihost_process_per_gpu():
    with open(os.path.join(REPO, "launch", "slurm_gpu.sbatch")) as f:
        text = f.read()
    assert "#SBATCH --ntasks-per-node=8" in text and "#SBATCH --gpus-per-node=8" in text
    assert "#SBATCH --signal=TERM@" in text  # preemption notice -> checkpoint and exit
    (srun,) = dry(
        "launch/slurm_gpu.sbatch",
        "--config=configs/lm.py:mesh=gpu_multinode",
        "--workdir=/shared/runs/lm",
        env={"DRY_RUN": "1"},
    )
    assert srun[0] == "srun" and "--kill-on-bad-exit=1" in srun
    assert srun[srun.index("launch.train") - 2 :] == [
        "python3",
        "-m",
        "launch.train",
        "--multihost",
        "--config=configs/lm.py:mesh=gpu_multinode",
        "--workdir=/shared/runs/lm",
    ]


def test_slurm_script_refuses_to_start_outside_the_repository(tmp_path):
    out = subprocess.run(
        ["bash", "launch/slurm_gpu.sbatch", "--workdir=w"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "DRY_RUN": "1", "SLURM_SUBMIT_DIR": str(tmp_path)},
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == f"slurm_gpu.sbatch: no launch/train.py in {tmp_path}; " + (
        "submit from the repository root\n"
    )


def sbatch_geometry() -> tuple[int, int, int]:
    with open(os.path.join(REPO, "launch", "slurm_gpu.sbatch")) as f:
        text = f.read()
    return tuple(
        int(re.search(rf"^#SBATCH --{name}=(\d+)$", text, re.MULTILINE).group(1))
        for name in ("nodes", "ntasks-per-node", "gpus-per-node")
    )


def srun_task_env(task, nodes, tasks_per_node, job_id=4242):
    """The variables srun sets for one task (default block distribution: tasks 0..7 on the
    first node) that jax's Slurm detection reads."""
    return {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_STEP_NODELIST": f"gpu[007-{7 + nodes - 1:03d}]",
        "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_NTASKS": str(nodes * tasks_per_node),
        "SLURM_PROCID": str(task),
        "SLURM_LOCALID": str(task % tasks_per_node),
        "SLURM_NODEID": str(task // tasks_per_node),
    }


def test_slurm_tasks_give_jax_one_process_per_gpu_and_the_mesh_one_row_per_node():
    # What `launch.train --multihost` does with no flags: jax.distributed.initialize() fills
    # coordinator, process count/id and local devices from the environment, through this call
    # (jax 0.10.2, pinned). The environment holds only what srun gives the task.
    from jax._src.clusters import ClusterEnv

    nodes, tasks_per_node, gpus_per_node = sbatch_geometry()
    assert tasks_per_node == gpus_per_node  # one process per GPU
    devices = []
    for task in range(nodes * tasks_per_node):
        env = srun_task_env(task, nodes, tasks_per_node)
        with mock.patch.dict(os.environ, env, clear=True):
            derived = ClusterEnv.auto_detect_unset_distributed_params(
                None, None, None, None, None, 300
            )
        coordinator, num_processes, process_id, local_device_ids = derived
        # Every task agrees on process 0's host and a port derived from the job id.
        assert coordinator == f"gpu007:{61440 + 4242 % 4096}"
        assert (num_processes, process_id) == (nodes * tasks_per_node, task)
        assert local_device_ids == [task % tasks_per_node]  # its own GPU of the node
        node = int(env["SLURM_NODEID"])
        # XLA numbers devices by process and gives one host's GPUs one slice_index.
        devices.append(FakeDevice(id=process_id, process_index=process_id, slice_index=node))
    mesh = make_mesh(mesh_config("gpu_multinode"), devices)
    assert dict(mesh.shape) == {"data": nodes, "fsdp": gpus_per_node, "model": 1}
    assert [{d.slice_index for d in row.flat} for row in mesh.devices] == [
        {n} for n in range(nodes)
    ]


def free_slurm_port() -> int:
    """A free port of the range jax's Slurm detection draws from (61440 + job id % 4096)."""
    for port in random.Random().sample(range(61440, 65536), 200):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 61440-65535")


STAND_IN_SRUN = """#!/usr/bin/env bash
# srun on one machine: SLURM_NTASKS copies of the command, each with srun's per-task variables.
while [[ "$1" == --* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NODEID=0 "$@" >"$TASK_LOGS/task$i.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
exit $status
"""


@pytest.mark.slow  # 2 processes importing jax and compiling: ~40 s of CPU
@pytest.mark.multiprocess
def test_slurm_script_trains_under_a_stand_in_srun(tmp_path):
    # The script as sbatch runs it, srun replaced by two local tasks with srun's variables and
    # nothing else: launch.train must find its coordinator and peers from them (gloo on CPU).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(STAND_IN_SRUN)
    (bin_dir / "srun").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
        "SLURM_JOB_ID": str(free_slurm_port() - 61440),
        "SLURM_NTASKS": "2",
        "SLURM_STEP_NODELIST": "localhost",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_SUBMIT_DIR": REPO,
        "TASK_LOGS": str(tmp_path),
        "JAX_PLATFORMS": "cpu",
        "JAX_NUM_CPU_DEVICES": "4",
    }
    flags = [
        "--config=configs/lm.py:size=smoke,task=copy,mesh=cpu",
        "--config.train.steps=2",
        "--config.train.eval_every=-1",
        "--config.task.length=8",
        f"--workdir={tmp_path / 'run'}",
    ]
    job = subprocess.Popen(
        # Started elsewhere, as sbatch starts its copy of the script: SLURM_SUBMIT_DIR leads home.
        ["bash", os.path.join(REPO, "launch", "slurm_gpu.sbatch"), *flags],
        cwd=tmp_path,
        env=env,
        start_new_session=True,
    )
    try:
        job.wait(timeout=240)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)  # the stand-in srun and both tasks
            job.wait()
    logs = [(tmp_path / f"task{i}.log").read_text() for i in range(2)]
    assert job.returncode == 0, logs[0][-3000:] + logs[1][-3000:]
    # Both tasks ran the job as processes 0 and 1 of 2; only process 0 reports.
    assert "done: step 2" in logs[0] and "done: step 2" not in logs[1]


BAD_CONFIGS = [
    # (entry point, arguments, what the one line must name)
    (
        "launch.train",
        ["--config=configs/lm.py:sizes=smoke"],
        ["'sizes=smoke'", "mesh, size, task"],
    ),
    (
        "launch.train",
        ["--config=configs/lm.py:size=smoke", "--config.train.stepz=3"],
        ["config.train has no field 'stepz'", "batch_size", "steps"],
    ),
    (
        "launch.train",
        ["--config=configs/lm.py:size=smoke", "--config.trian.steps=3"],
        ["config has no field 'trian'", "train"],
    ),
    (
        "launch.train",
        ["--config=configs/lm.py:size=smoke", "--config.train.steps=abc"],
        ["--config.train.steps=abc", "config.train.steps is int"],
    ),
    # Bad values of generic fields: refused by core.validate before step 1, naming the method.
    (
        "launch.train",
        ["--config=configs/lm.py:size=smoke", "--config.train.batch_size=0"],
        ["lm: train.batch_size=0", "positive integer"],
    ),
    (
        "launch.train",
        ["--config=configs/lm.py:size=smoke", "--config.train.steps=-5"],
        ["lm: train.steps=-5", "non-negative integer"],
    ),
    (  # divisible by the 8 data-parallel devices, but not a divisor of the evaluation's 64
        "launch.train",
        ["--config=configs/lm.py:size=smoke", "--config.train.batch_size=24"],
        ["lm: ", "eval.num_examples=64 must be a multiple of train.batch_size=24"],
    ),
    ("launch.train", ["--config=configs/nope.py"], ["no file 'configs/nope.py'", "lm.py"]),
    ("launch.bench", ["--methods=nope"], ["no benchmark for nope", "available: ", " lm,"]),
    ("launch.bench", ["--method=lm"], ["Unknown command line flag 'method'"]),
    ("launch.reproduce", ["--methods=no_such"], ["no experiment for ['no_such']", "lm"]),
    ("launch.reproduce", ["--methds=lm"], ["Unknown command line flag 'methds'"]),
]


# With the aot extra installed, jax-cuda12-plugin's C++ start-up logs these two lines on every
# `import jax`, before any of our code runs (JAX_PLATFORMS=cpu does not stop it); they are not
# ours to silence, and only these exact lines are let through.
CUDA_PLUGIN_NOISE = re.compile(
    r"WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|I\d{4} [\d:.]+ +\d+ cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine"
)

OUT_FLAG = {"launch.train": "workdir", "launch.bench": "out", "launch.reproduce": "out"}


def test_bad_config_input_is_one_line_on_stderr(tmp_path):
    # Started together, then awaited: each spends its time importing, not computing.
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", entry, *args, f"--{OUT_FLAG[entry]}={tmp_path}/{i}"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, (entry, args, _) in enumerate(BAD_CONFIGS)
    ]
    for proc, (entry, args, needles) in zip(procs, BAD_CONFIGS, strict=True):
        stdout, stderr = proc.communicate(timeout=300)
        lines = [line for line in stderr.splitlines() if not CUDA_PLUGIN_NOISE.match(line)]
        assert proc.returncode != 0 and len(lines) == 1, (entry, args, stderr[-2000:])
        assert lines[0].startswith("error: ") and "Traceback" not in stderr, lines
        for needle in needles:
            assert needle in lines[0], (needle, lines[0])
    assert not list(tmp_path.iterdir())  # nothing ran: no workdir or output was created


def test_from_results_says_in_one_line_what_it_cannot_rederive(tmp_path, capsys, monkeypatch):
    from launch import reproduce
    from methods.csnn import experiment as csnn_experiment

    # An experiment without claims_from_results (every method has one once on the protocol,
    # so csnn's is removed here); lm has one but no quick results under tmp_path.
    monkeypatch.delattr(csnn_experiment, "claims_from_results")
    assert reproduce.reproduce(["csnn", "lm"], str(tmp_path), True, from_results=True) == []
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("csnn: no claims_from_results(results)") and "rerun" in lines[0]
    assert lines[1].startswith("lm: no results file") and "quick.json" in lines[1]


def test_one_summary_table_for_every_method():
    from core.claims import Claim, IntervalClaim, Report
    from launch import reproduce

    reports = [
        Report("lm", [IntervalClaim.at_most("parity fails", "p", [0.5, 0.5, 0.52], 0.6)], {}, 10),
        Report("deql", [Claim("a", "m", 0.1, ">=", 0.2), Claim("b", "m", 1, ">", 0)], {}, 5.4),
    ]
    text = reproduce.summary(reports)
    rows = [line.split() for line in text.splitlines()]
    assert [r[0] for r in rows[1:4]] == ["lm", "deql", "deql"]
    assert rows[2][-1] == "NO" and rows[3][-1] == "yes"
    assert text.endswith("2 of 3 claims hold over 2 methods; 15 s")
    markdown = reproduce.summary_markdown(reports)
    assert "| lm | parity fails | 0.5067 [0.5, 0.52] | 3 | high < 0.6 | yes |" in markdown


def test_from_results_reads_every_part_of_a_multi_part_experiment(tmp_path, capsys):
    """flow_mtp's full run is three records and its re-test two (RESULT_RUNS); re-deriving reads
    each committed file and gives every part's claims, in order, the same as each part's own
    function."""
    from core import results
    from launch import reproduce
    from methods.flow_mtp import code_experiment, experiment, experiment_code_v2, experiment_cptp

    (report,) = reproduce.reproduce(["flow_mtp"], str(tmp_path), False, from_results=True)
    records = {run: results.load("flow_mtp", run) for run in experiment.RESULT_RUNS}
    expected = (
        experiment.toy_claims(records["full"])
        + code_experiment.claims_code(records["full_code"])
        + experiment_cptp.claims_cptp(records["full_cptp"])
        + experiment_code_v2.claims_from_results(records["full_code_v2"])
        + experiment_cptp.claims_cptp(records["full_cptp_v2"])
    )
    assert [c.to_dict() for c in report.claims] == [c.to_dict() for c in expected]
    assert len({c.metric for c in report.claims}) == len(report.claims)  # no part read twice
    assert all(f"results/{run}.json" in report.notes for run in experiment.RESULT_RUNS)


def test_a_quick_run_shows_each_claim_beside_the_committed_full_run(tmp_path, monkeypatch):
    """The quick run's report beside doit's committed full run, re-derived exactly as
    `--from_results` does and never retrained; the tables and counts in the markdown files."""
    from core.claims import IntervalClaim, Report
    from core.errors import ConfigError
    from launch import reproduce
    from methods.doit import experiment as doit_experiment

    full_job = reproduce.run_job(["doit"], str(tmp_path / "full"), False, from_results=True)
    assert full_job.sides is None  # a full run (here re-derived) is reported as before
    (full,) = full_job.reports
    shared, full_only = full.claims[0], full.claims[1:]
    quick_claims = [
        IntervalClaim.at_least("a claim only the quick run makes", "quick/only", [1, 1, 1], 0.5),
        IntervalClaim.at_least(shared.text, shared.metric, [0.0, 0.1, 0.2], 0.5),  # fails
    ]
    trained = []

    def fake_run_one(name, out, quick):  # the only way to training: the quick run's alone
        trained.append((name, quick))
        return Report(name, quick_claims, {}, wall_seconds=4.0)

    monkeypatch.setattr(reproduce, "run_one", fake_run_one)
    out = tmp_path / "quick"
    job = reproduce.run_job(["doit"], str(out), quick=True)
    assert trained == [("doit", True)]
    (side,) = job.sides
    assert [c.to_dict() for c in side.full.claims] == [c.to_dict() for c in full.claims]
    assert [(r.full, r.quick) for r in side.rows] == [
        (shared, quick_claims[1]),
        *((c, None) for c in full_only),
        (None, quick_claims[0]),
    ]
    page, report = (out / "doit.md").read_text(), (out / "REPORT.md").read_text()
    held = sum(c.holds for c in full.claims)
    for text in (page, report):
        assert "smoke check at reduced size" in text
        assert f"| {shared.text} | {shared.measured_text()} |" in text
        assert text.count("| not in quick run |") == len(full_only)
        assert text.count("| not in full run |") == 1
    assert f"full runs (committed): {held} of {len(full.claims)} claims hold" in report
    assert "this quick run (smoke, reduced size): 1 of 2 claims hold" in report

    # Without a committed full run (here: its files renamed away), every row says so.
    monkeypatch.setattr(doit_experiment, "RESULT_RUNS", ("full_not_committed",))
    (side,) = reproduce.run_job(["doit"], str(out), quick=True).sides
    assert side.full is None and "no results file" in side.why_no_full
    assert (out / "doit.md").read_text().count("| no full run |") == len(quick_claims)
    # A committed record its code refuses: the quick run still reports, saying why.
    monkeypatch.undo()
    monkeypatch.setattr(reproduce, "run_one", fake_run_one)

    def refuse(record):
        raise ConfigError(f"doit: {record['run']} record refused")

    monkeypatch.setattr(doit_experiment, "claims_from_results", refuse)
    (side,) = reproduce.run_job(["doit"], str(out), quick=True).sides
    assert side.full is None and side.why_no_full == "doit: full record refused"
