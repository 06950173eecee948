"""core.wheels.extract_member: one file out of a wheel, written atomically; failures are one
WheelError line (pip is replaced by a stand-in that writes a wheel or fails)."""

import subprocess
import zipfile
from pathlib import Path

import pytest

from core import wheels


def fake_pip(files: dict[str, bytes] | None):
    def run(cmd, **kwargs):
        if files is None:
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution\n")
        dest = Path(cmd[cmd.index("--dest") + 1])
        with zipfile.ZipFile(dest / "pkg-1.0-py3-none-any.whl", "w") as zf:
            for name, data in files.items():
                zf.writestr(name, data)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    return run


def test_extract_member_writes_only_that_file_under_its_target_name(tmp_path, monkeypatch):
    files = {"pkg/data/a.txt": b"alpha", "pkg/data/b.txt": b"beta"}
    monkeypatch.setattr(wheels.subprocess, "run", fake_pip(files))
    target = tmp_path / "cache" / "renamed.txt"
    assert wheels.extract_member("pkg==1.0", "pkg/data/b.txt", target) == target
    assert target.read_bytes() == b"beta"
    assert sorted(p.name for p in target.parent.iterdir()) == ["renamed.txt"]  # no leftovers


def test_a_missing_member_or_a_failed_download_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(wheels.subprocess, "run", fake_pip({"pkg/x": b""}))
    with pytest.raises(wheels.WheelError, match="no member pkg/y") as e:
        wheels.extract_member("pkg==1.0", "pkg/y", tmp_path / "y")
    assert "\n" not in str(e.value) and not (tmp_path / "y").exists()
    monkeypatch.setattr(wheels.subprocess, "run", fake_pip(None))
    with pytest.raises(wheels.WheelError, match="No matching distribution"):
        wheels.extract_member("pkg==1.0", "pkg/x", tmp_path / "x")
    assert not (tmp_path / "x").exists()
