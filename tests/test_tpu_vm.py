"""launch/tpu_vm.sh through its --dry-run output (no gcloud needed), its setup command run
against a stand-in home directory, and its one-line errors."""

import os
import shlex
import shutil
import subprocess
import tarfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "launch", "tpu_vm.sh")
QR = ["gcloud", "compute", "tpus", "queued-resources"]


def launch(*args, script=SCRIPT, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", script, *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


def dry(*args, **kwargs) -> list[list[str]]:
    """The argv of every command the script would run, from its '+ cmd' lines."""
    out = launch("--dry-run", *args, **kwargs)
    assert out.returncode == 0, out.stderr
    return [shlex.split(line[2:]) for line in out.stdout.splitlines() if line.startswith("+ ")]


def flag(argv, name):
    return next(a for a in argv if a.startswith(f"--{name}=")).removeprefix(f"--{name}=")


RUNTIME_VERSIONS = {  # https://cloud.google.com/tpu/docs/runtimes, "PyTorch and JAX"
    "v4-32": "tpu-ubuntu2204-base",
    "v5litepod-16": "v2-alpha-tpuv5-lite",
    "v5p-8": "v2-alpha-tpuv5",
    "v6e-8": "v2-alpha-tpuv6e",
}


@pytest.mark.parametrize("accelerator", RUNTIME_VERSIONS)
def test_create_takes_the_runtime_version_of_the_accelerator(accelerator):
    (create,) = dry("create", "my-tpu", f"--type={accelerator}", "--zone=z1")
    assert create[:6] == [*QR, "create", "my-tpu"]
    assert flag(create, "runtime-version") == RUNTIME_VERSIONS[accelerator]
    assert flag(create, "accelerator-type") == accelerator and flag(create, "zone") == "z1"
    # One slice: a single node named like the queued resource; no multi-slice flags.
    assert flag(create, "node-id") == "my-tpu"
    assert not any(a.startswith(("--node-count", "--node-prefix")) for a in create)


def test_create_several_slices_is_one_queued_resource_with_a_node_count():
    (create,) = dry(
        "create", "pod", "--type=v5p-16", "--slices=4", "--spot", "--project=p1", "--version=v9"
    )
    assert create[:6] == [*QR, "create", "pod"]
    assert flag(create, "node-count") == "4" and flag(create, "node-prefix") == "pod"
    assert not any(a.startswith("--node-id") for a in create)
    assert {"--spot", "--project=p1", "--runtime-version=v9"} <= set(create)


def test_setup_sends_git_archive_of_head_and_installs_python_311():
    archive, scp, ssh = dry("setup", "my-tpu", "--zone=z1")
    tarball = flag(archive, "output")
    assert archive[:4] == ["git", "-C", REPO, "archive"]
    assert archive[4:] == ["--format=tar.gz", f"--output={tarball}", "HEAD"]
    # The archive, not the working tree (.venv, results, workdirs), goes to every worker.
    assert scp[:5] == [*QR, "scp"] and scp[5:7] == [tarball, "my-tpu:iclr26.tar.gz.new"]
    assert "--recurse" not in scp and REPO not in scp
    for command in scp, ssh:
        assert {"--worker=all", "--node=all", "--zone=z1"} <= set(command)
    remote = flag(ssh, "command")
    assert "pip install --user --quiet uv==0.13.9" in remote  # pinned
    assert "uv venv --quiet --allow-existing --python 3.11 .venv" in remote
    assert "uv pip install --quiet --python .venv/bin/python -e '.[tpu]'" in remote


def stand_in_home(tmp_path):
    """A home directory where `python3 -m pip` and `uv` only record their arguments."""
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    (home / ".local" / "bin").mkdir(parents=True)
    bin_dir.mkdir()
    log = tmp_path / "calls.txt"
    for path in (bin_dir / "python3", home / ".local" / "bin" / "uv"):
        path.write_text(f'#!/bin/sh\necho "$(basename "$0") $* @ $PWD" >> {log}\n')
        path.chmod(0o755)
    return home, bin_dir, log


def send(home, files):
    """What `scp` leaves on a worker: a tarball of `files` as iclr26.tar.gz.new."""
    with tarfile.open(home / "iclr26.tar.gz.new", "w:gz") as tar:
        for name, text in files.items():
            path = home / "staging" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            tar.add(path, arcname=name)
    shutil.rmtree(home / "staging")


def test_setup_replaces_the_sent_files_and_keeps_the_rest(tmp_path):
    (_, _, ssh) = dry("setup", "my-tpu")
    remote = flag(ssh, "command")
    home, bin_dir, log = stand_in_home(tmp_path)
    env = {"HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def setup():
        # ssh runs the command in the home directory.
        out = subprocess.run(
            ["bash", "-c", remote], cwd=home, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr

    send(home, {"pyproject.toml": "v1", "core/old.py": "old", "core/kept.py": "v1"})
    setup()
    tree = home / "iclr26"
    (tree / ".venv").mkdir()
    (tree / "results").mkdir()
    (tree / "results" / "run.json").write_text("{}")
    send(home, {"pyproject.toml": "v2", "core/kept.py": "v2"})
    setup()
    assert [(tree / f).read_text() for f in ("pyproject.toml", "core/kept.py")] == ["v2", "v2"]
    assert not (tree / "core" / "old.py").exists()  # deleted from the repository: gone
    assert (tree / ".venv").is_dir() and (tree / "results" / "run.json").exists()  # not ours
    assert not (home / "iclr26.tar.gz.new").exists()
    calls = log.read_text().splitlines()
    assert calls[:3] == [
        f"python3 -m pip install --user --quiet uv==0.13.9 @ {home}",
        f"uv venv --quiet --allow-existing --python 3.11 .venv @ {tree}",
        f"uv pip install --quiet --python .venv/bin/python -e .[tpu] @ {tree}",
    ]


def test_setup_archives_committed_files_only(tmp_path):
    # A copy of the script in a scratch repository, with a stand-in gcloud that keeps what scp
    # would send: the archive of HEAD, whatever else the working tree holds.
    repo = tmp_path / "repo"
    (repo / "launch").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "launch")
    (repo / "tracked.py").write_text("committed")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "c"], check=True)
    (repo / "tracked.py").write_text("edited, not committed")
    (repo / ".venv").mkdir()
    (repo / "untracked.txt").write_text("x")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "gcloud").write_text(
        f'#!/bin/sh\nprintf "%s\\n" "$*" >> {tmp_path}/gcloud.txt\n'
        f'[ "$4" = scp ] && cp "$5" {tmp_path}/sent.tar.gz\nexit 0\n'
    )
    (bin_dir / "gcloud").chmod(0o755)
    out = launch(
        "setup",
        "my-tpu",
        script=str(repo / "launch" / "tpu_vm.sh"),
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "TMPDIR": str(tmp_path)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith(f"tpu_vm.sh: uncommitted changes in {repo} are not sent")
    with tarfile.open(tmp_path / "sent.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["launch", "launch/tpu_vm.sh", "tracked.py"]
        assert tar.extractfile("tracked.py").read() == b"committed"
    assert len((tmp_path / "gcloud.txt").read_text().splitlines()) == 2  # scp, ssh
    assert not list(tmp_path.glob("iclr26-*.tar.gz"))  # the local copy is removed


def test_run_starts_the_same_train_command_on_every_worker_of_every_slice():
    train_flags = ["--config=configs/lm.py:mesh=tpu_multislice,size=base", "--workdir=gs://b/r 1"]
    (ssh,) = dry("run", "pod", "--", *train_flags)
    assert ssh[:6] == [*QR, "ssh", "pod"] and {"--worker=all", "--node=all"} <= set(ssh)
    setup, _, command = flag(ssh, "command").partition(" && ")
    assert setup == "cd ~/iclr26"
    # The remote shell sees exactly the flags we gave, spaces and commas included.
    assert shlex.split(command) == [
        ".venv/bin/python",
        "-m",
        "launch.train",
        "--multihost",
        *train_flags,
    ]


def test_status_and_delete_address_the_queued_resource():
    (status,) = dry("status", "pod", "--zone=z1")
    assert status[:6] == [*QR, "describe", "pod"]
    (delete,) = dry("delete", "pod", "--zone=z1")
    # --force also deletes the slices' nodes; --quiet answers gcloud's prompt.
    assert delete[:6] == [*QR, "delete", "pod"] and {"--force", "--quiet"} <= set(delete)


@pytest.mark.parametrize(
    "args, message",
    [
        (["create", "x", "--type=v5e-8"], "unknown accelerator type 'v5e-8'"),
        (["create", "x", "--type=v7-8"], "unknown accelerator type 'v7-8'"),
        (["create", "x", "--type=v4-8x"], "unknown accelerator type 'v4-8x'"),
        (["create", "x", "--slices=0"], "--slices=0 is not a positive integer"),
        (["create", "x", "--slices=two"], "--slices=two is not a positive integer"),
        (["bogus", "x"], "unknown action 'bogus'"),
        (["create", "x", "--typo=1"], "unknown option '--typo=1'"),
        (["run", "x"], "run needs -- followed by launch.train flags"),
    ],
)
def test_bad_input_is_one_line_naming_it(args, message):
    out = launch("--dry-run", *args)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [out.stderr.strip()]
    assert out.stderr.startswith("tpu_vm.sh: ") and message in out.stderr
