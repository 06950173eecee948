"""Workdir storage: a local folder or a gs:// bucket, every file operation through etils.epath.

On a TPU VM the workdir is a gs:// bucket that every host sees; anything written there with
`open` or `os` would land on the VM's own disk (as `./gs:/...`) and vanish with it. So workdir
code goes through `epath.Path` (gcsfs behind gs://) and orbax (tensorstore's GCS driver for the
arrays). Other schemes (s3://, ...) are refused: orbax 0.12.8 writes arrays only to gs:// or a
local disk.

Object stores have neither rename nor append. What they do guarantee is that one object write
is atomic: the new object appears whole once its upload completes, or the old one stays. That is
the guarantee `write_atomic` keeps on both kinds of storage (a local rename gives the same).
"""

import os
import uuid

from etils import epath

from core.errors import ConfigError

REMOTE = "gs://"


def is_local(path: epath.PathLike) -> bool:
    return not os.fspath(path).startswith(REMOTE)


def resolve(path: epath.PathLike, *, what: str = "workdir") -> epath.Path:
    """`path` as an epath.Path (absolute if local); a one-line ConfigError for a scheme orbax
    cannot write arrays to, or for gs:// without its filesystem installed."""
    text = os.fspath(path)
    if "://" in text and not text.startswith(REMOTE):
        raise ConfigError(
            f"{what} {text!r}: only a local path or gs://bucket/... is supported "
            "(orbax writes checkpoints to a local disk or Google Cloud Storage)"
        )
    if is_local(text):
        return epath.Path(os.path.abspath(text))
    try:
        import fsspec

        fsspec.get_filesystem_class("gs")
    except ImportError:
        raise ConfigError(
            f"{what} {text!r} needs gcsfs and google-cloud-storage: pip install '.[gcs]'"
        ) from None
    return epath.Path(text)


def require_local(path: str, *, what: str) -> str:
    """`path` if it is a local folder; a one-line ConfigError for a URL (for outputs written
    with local tools: reports, figures, benchmark records, experiment caches)."""
    if "://" in os.fspath(path):
        raise ConfigError(f"{what} {path!r} must be a local folder (copy it to a bucket after)")
    return path


def prepare_workdir(workdir: epath.PathLike) -> epath.Path:
    """Create `workdir` (a no-op on an object store) and prove it writable, or fail with one
    line saying why it cannot be used."""
    path = resolve(workdir)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{uuid.uuid4().hex}"  # unique across hosts sharing it
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise ConfigError(f"workdir {str(path)!r} is not writable: {e.strerror or e}") from None
    return path


def write_atomic(path: epath.Path, text: str) -> None:
    """Readers see the old content or the new, never part of it; a killed writer leaves the old.
    Locally: a temporary file renamed over the target (rename(2) is atomic). On an object store:
    one object write (its upload publishes it whole), since a rename there is a copy."""
    if is_local(path):
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # one per process
        tmp.write_text(text)
        tmp.replace(path)
    else:
        path.write_text(text)


class LineLog:
    """A text file grown line by line (metrics.jsonl).

    Locally each line is appended and flushed as it comes, so a killed run loses none. An object
    store cannot append: the lines are held here and the whole object is rewritten at each
    `sync()` (one atomic write), so a kill loses the lines since the last sync. The training loop
    syncs before every checkpoint: what a resumed run keeps (rows up to its checkpoint) is
    always stored, and the later rows are dropped and written again on resume anyway.
    """

    def __init__(self, path: epath.Path):
        self.path = path
        self._lines: list[str] | None = None
        self._file = None
        if is_local(path):
            self._file = path.open("a")
        else:
            self._lines = path.read_text().splitlines(keepends=True) if path.exists() else []
            self._unsynced = False

    def write(self, line: str) -> None:
        if self._file is not None:
            self._file.write(line)
            self._file.flush()
        else:
            self._lines.append(line)
            self._unsynced = True

    def sync(self) -> None:
        if self._lines is not None and self._unsynced:
            self.path.write_text("".join(self._lines))
            self._unsynced = False

    def close(self) -> None:
        self.sync()
        if self._file is not None:
            self._file.close()
            self._file = None
