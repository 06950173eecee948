"""A byte-level text corpus from local files, split by a hash of each file's path.

    corpus = python_stdlib()                           # the standard library's .py sources
    corpus.split("train")                              # uint8 bytes of the train files, joined
    corpus.summary()                                   # file count, bytes, SHA-256 per split
    windows_NT = corpus.windows("test", length=128, count=256, seed=0)

Bytes are the tokens (V = 256), so nothing is tokenised and nothing is downloaded: the corpus
is whatever the machine holds. Which files and which bytes are recorded as a SHA-256 over
(relative path, bytes) of every file in sorted order, so runs on two machines are comparable
only when the hashes agree (another Python version ships other sources).

A file's split is a function of its relative path alone (the first 8 bytes of its SHA-256
modulo 1000 against the split fractions), never of its position in a listing: adding or
removing a file moves no other file between splits. Files are joined in sorted path order, each
followed by one newline, so a window may span the end of one file and the start of the next.
"""

import dataclasses
import functools
import hashlib
import os
import sysconfig
from collections.abc import Iterable

import numpy as np

from core.errors import ConfigError

SPLITS = ("train", "validation", "test")
# Test suites are excluded (much of them is generated data and long literal tables), and so are
# installed packages (they differ from machine to machine).
EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages"})


def split_of(rel_path: str, fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)) -> str:
    """train / validation / test from a hash of the relative path (per-mille resolution)."""
    bucket = int.from_bytes(hashlib.sha256(rel_path.encode()).digest()[:8], "big") % 1000
    bounds = np.cumsum(fractions) * 1000
    return SPLITS[int(np.searchsorted(bounds, bucket, side="right"))]


@dataclasses.dataclass(frozen=True)
class Corpus:
    root: str
    files: tuple[tuple[str, bytes], ...]  # (relative path, content), sorted by path
    fractions: tuple[float, float, float] = (0.8, 0.1, 0.1)

    def __post_init__(self):
        if not self.files:
            raise ConfigError(f"corpus: no files under {self.root}")
        if len(self.fractions) != 3 or min(self.fractions) <= 0 or sum(self.fractions) != 1:
            raise ConfigError(
                f"corpus: split fractions {self.fractions} must be 3 > 0 summing to 1"
            )

    def split_files(self, split: str) -> list[tuple[str, bytes]]:
        if split not in SPLITS:
            raise ConfigError(f"corpus split {split!r}; expected one of: {', '.join(SPLITS)}")
        return [(p, b) for p, b in self.files if split_of(p, self.fractions) == split]

    @functools.lru_cache(maxsize=3)  # noqa: B019 (frozen instance: a stable cache key)
    def split(self, split: str) -> np.ndarray:
        """The split's files joined (sorted by path, a newline after each) as uint8."""
        joined = b"".join(content + b"\n" for _, content in self.split_files(split))
        return np.frombuffer(joined, np.uint8)

    def windows(self, split: str, *, length: int, count: int, seed: int) -> np.ndarray:
        """`count` windows of `length` bytes at uniform offsets of the split (int32 [N, T])."""
        data = self.split(split)
        if data.size <= length:
            raise ConfigError(f"corpus split {split!r} has {data.size} bytes, <= window {length}")
        starts = np.random.default_rng([seed, length]).integers(0, data.size - length, count)
        return data[starts[:, None] + np.arange(length)[None, :]].astype(np.int32)

    def summary(self) -> dict:
        """Per split and in all: file count, bytes, SHA-256 over (relative path, bytes)."""
        out = {}
        for name in (*SPLITS, "all"):
            files = self.files if name == "all" else self.split_files(name)
            out[name] = {
                "files": len(files),
                "bytes": sum(len(b) for _, b in files),
                "sha256": content_hash(files),
            }
        return out


def content_hash(files: Iterable[tuple[str, bytes]]) -> str:
    """SHA-256 over each file's relative path, length and bytes, in the given order."""
    digest = hashlib.sha256()
    for rel, content in files:
        digest.update(f"{rel}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def from_directory(root: str, *, suffix: str = ".py", fractions=(0.8, 0.1, 0.1)) -> Corpus:
    """Every `suffix` file under `root` outside EXCLUDED_DIRS and caches, sorted by path."""
    if not os.path.isdir(root):
        raise ConfigError(f"corpus: directory {root!r} does not exist")
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS and d != "__pycache__"]
        for name in filenames:
            if name.endswith(suffix):
                path = os.path.join(dirpath, name)
                found.append(os.path.relpath(path, root).replace(os.sep, "/"))
    files = []
    for rel in sorted(found):
        with open(os.path.join(root, rel), "rb") as f:
            files.append((rel, f.read()))
    return Corpus(root, tuple(files), tuple(fractions))


@functools.lru_cache(maxsize=1)
def python_stdlib() -> Corpus:
    """The running interpreter's standard library .py sources (no tests, no site-packages)."""
    return from_directory(sysconfig.get_paths()["stdlib"])
