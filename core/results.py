"""Results files: every full run's per-seed raw numbers, its config and its code version.

    methods/<slug>/results/<run>.json = {
        "method": slug, "run": name, "created": ISO time (UTC),
        "code": {"git_commit", "git_dirty", "source_hash", "source_files"},
        "config": the experiment's settings (JSON),
        "rows": [{"seed": 0, "task": "copy", "exact_match": 1.0, ...}, ...],
        ...anything else the experiment adds (e.g. "quick": false)
    }

Rows are flat per-seed (or per-split) records rather than nested {seed: value} maps: JSON turns
integer keys into strings, and flat rows keep the seed a number that `by_seed` can pair on. The
claims are *derived* from this file (`experiment.claims_from_results(results)`), so README numbers
come from a committed file and `python -m launch.reproduce --from_results` re-derives the table
without rerunning anything.

The code version says which code produced the numbers: the git commit and whether the work tree
had uncommitted changes (None for both outside a git checkout), and a SHA-256 over the method's
and the core's source files, which also identifies code that was never committed.
"""

import datetime
import glob
import hashlib
import json
import os
import subprocess
from collections.abc import Iterable, Mapping

from core.errors import ConfigError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_files(slug: str | None = None, repo: str = REPO) -> list[str]:
    """The Python sources whose change can change a method's numbers: core/, and the method's
    package and config when `slug` is given (repo-relative, sorted)."""
    patterns = ["core/**/*.py"]
    if slug:
        patterns += [f"methods/{slug}/**/*.py", f"configs/{slug}.py", "configs/common.py"]
    found = {p for pattern in patterns for p in glob.glob(pattern, root_dir=repo, recursive=True)}
    return sorted(found)


READERS = ("experiment.py", "report.py", "bench.py")
# The core's modules that read a run's numbers or order runs without changing one: a claim's
# interval and power, validation-only selection, the experiment runner's loop and its command
# line. Out of every run's code key, so editing them retrains nothing (a grid half-way through
# resumes from its cache at a later commit).
CORE_READERS = (
    "core/claims.py",
    "core/selection.py",
    "core/experiment_runner.py",
    "core/experiment_cli.py",
)


def run_sources(slug: str, *, besides: Iterable[str] = READERS) -> tuple:
    """`source_files(slug)` without the files that only read numbers (the method's `besides`: its
    experiment's claims and grids, `report.py`'s tables and figures of a record, its benchmark;
    and CORE_READERS): the code key of a run cache, so that editing a claim or widening a grid
    refits only the new points."""
    leave_out = {f"methods/{slug}/{name}" for name in besides} | set(CORE_READERS)
    return tuple(f for f in source_files(slug) if f not in leave_out)


def source_hash(files: Iterable[str], repo: str = REPO) -> str:
    """SHA-256 over the files' relative paths and bytes (a rename changes it too)."""
    digest = hashlib.sha256()
    for path in sorted(files):
        with open(os.path.join(repo, path), "rb") as f:
            content = f.read()
        digest.update(f"{path}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


def _git(*args: str, repo: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=repo, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None  # no git, or not a checkout (an installed wheel)
    return out.stdout.strip()


def code_version(slug: str | None = None, repo: str = REPO) -> dict:
    files = source_files(slug, repo)
    commit = _git("rev-parse", "HEAD", repo=repo)
    status = _git("status", "--porcelain", "--untracked-files=no", repo=repo)
    return {
        "git_commit": commit,
        "git_dirty": None if status is None else bool(status),
        "source_hash": source_hash(files, repo),
        "source_files": len(files),
    }


def path(slug: str, run: str, root: str | None = None) -> str:
    """`methods/<slug>/results/<run>.json`, or `<root>/<slug>/<run>.json`."""
    if not run or os.sep in run or run.startswith("."):
        raise ConfigError(f"results run name {run!r} must be a plain file name, e.g. 'full'")
    folder = os.path.join(root, slug) if root else os.path.join(REPO, "methods", slug, "results")
    return os.path.join(folder, f"{run}.json")


def record(
    slug: str, run: str, *, config: Mapping, rows: list[dict], code: dict | None = None, **extra
) -> dict:
    """A results record (not yet written): the rows, config and code version (`code`, when the
    caller computed it already, e.g. for cache keys)."""
    return {
        "method": slug,
        "run": run,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "code": code or code_version(slug),
        "config": dict(config),
        "rows": list(rows),
        **extra,
    }


def save(results: Mapping, root: str | None = None) -> str:
    """Write a record to `path(results["method"], results["run"], root)` (atomically)."""
    target = path(results["method"], results["run"], root)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    with open(target + ".tmp", "w") as f:
        json.dump(results, f, indent=1, sort_keys=True, allow_nan=True)
        f.write("\n")
    os.replace(target + ".tmp", target)  # never a half-written results file
    return target


def load(slug: str, run: str, root: str | None = None) -> dict:
    target = path(slug, run, root)
    if not os.path.exists(target):
        raise ConfigError(f"{slug}: no results file {target}; run it first")
    with open(target) as f:
        return json.load(f)


def by_seed(rows: Iterable[Mapping], metric: str, key: str = "seed", **where) -> dict:
    """{row[key]: row[metric]} over the rows matching `where` (e.g. task="copy"); one row per
    key, or a one-line error (two rows for one seed would be silently overwritten)."""
    out = {}
    for row in rows:
        if all(row.get(k) == v for k, v in where.items()):
            if row[key] in out:
                raise ConfigError(f"two rows with {key}={row[key]} for {where or 'all rows'}")
            out[row[key]] = row[metric]
    return out
