"""The launchers: TPU VM and Slurm scripts through their dry-run output; the Python entry
points' one-line errors for bad config input."""

import os
import shlex
import subprocess
import sys

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


def test_tpu_vm_create_and_delete():
    (create,) = dry(
        "launch/tpu_vm.sh",
        "--dry-run",
        "create",
        "my-tpu",
        "--type=v5litepod-16",
        "--zone=us-west4-a",
        "--spot",
        "--project=p1",
    )
    assert create[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"]
    assert {
        "my-tpu",
        "--accelerator-type=v5litepod-16",
        "--zone=us-west4-a",
        "--spot",
        "--project=p1",
    } <= set(create)
    (delete,) = dry("launch/tpu_vm.sh", "--dry-run", "delete", "my-tpu", "--zone=us-west4-a")
    assert delete[4:6] == ["delete", "my-tpu"] and "--quiet" in delete


def test_tpu_vm_run_starts_the_same_train_command_on_every_worker():
    train_flags = ["--config=configs/lm.py:mesh=tpu,size=base", "--workdir=gs://b/run one"]
    (ssh,) = dry("launch/tpu_vm.sh", "--dry-run", "run", "my-tpu", "--", *train_flags)
    assert ssh[4:6] == ["ssh", "my-tpu"] and "--worker=all" in ssh
    remote = next(a for a in ssh if a.startswith("--command=")).removeprefix("--command=")
    setup, _, command = remote.partition(" && ")
    assert setup == "cd ~/iclr26"
    # The remote shell sees exactly the flags we gave, spaces and commas included.
    assert shlex.split(command) == ["python3", "-m", "launch.train", "--multihost", *train_flags]


def test_tpu_vm_setup_copies_the_repo_and_installs_tpu_extras():
    scp, ssh = dry("launch/tpu_vm.sh", "--dry-run", "setup", "my-tpu")
    assert scp[4] == "scp" and REPO in scp and "my-tpu:~/iclr26" in scp
    assert "pip install -q -e '.[tpu]'" in next(a for a in ssh if a.startswith("--command="))


def test_tpu_vm_rejects_unknown_actions_and_options():
    for args in (["bogus", "x"], ["create", "x", "--typo=1"], ["run", "x"]):
        out = subprocess.run(
            ["bash", "launch/tpu_vm.sh", "--dry-run", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert out.returncode == 2 and "tpu_vm.sh" in out.stderr + out.stdout


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
    ("launch.train", ["--config=configs/nope.py"], ["no file 'configs/nope.py'", "lm.py"]),
    ("launch.bench", ["--methods=nope"], ["no benchmark for nope", "deql, lm"]),
    ("launch.bench", ["--method=lm"], ["Unknown command line flag 'method'"]),
    ("launch.reproduce", ["--methods=no_such"], ["no experiment for ['no_such']", "lm"]),
    ("launch.reproduce", ["--methds=lm"], ["Unknown command line flag 'methds'"]),
]


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
        lines = stderr.splitlines()
        assert proc.returncode != 0 and len(lines) == 1, (entry, args, stderr[-2000:])
        assert lines[0].startswith("error: ") and "Traceback" not in stderr, lines
        for needle in needles:
            assert needle in lines[0], (needle, lines[0])
    assert not list(tmp_path.iterdir())  # nothing ran: no workdir or output was created


def test_from_results_says_in_one_line_what_it_cannot_rederive(tmp_path, capsys):
    from launch import reproduce

    # csnn has no claims_from_results yet; lm has one but no quick results under tmp_path.
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
    assert text.endswith("2/3 claims hold over 2 methods; 15 s")
    markdown = reproduce.summary_markdown(reports)
    assert "| lm | parity fails | 0.5067 [0.5, 0.52] | 3 | high < 0.6 | yes |" in markdown
