"""The TPU VM and Slurm launchers, checked through their dry-run output."""

import os
import shlex
import subprocess

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
