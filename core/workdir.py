"""Workdir bookkeeping: the config of every run, refusal of a mismatched one, metrics rewind.

`<workdir>/config.json` is the config the run's checkpoints belong to. Starting in a workdir that
holds a different config is refused with the differing fields listed, unless the caller allows
it (then config.json is updated). Every start is recorded in `<workdir>/runs/`, so the config of
every run is kept. Every file operation goes through `core.storage` (a local folder or gs://).
"""

import json
import time
import uuid
from typing import Any

from etils import epath

from core import storage
from core.errors import ConfigError


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: list(tree) if isinstance(tree, tuple) else tree}


# Fields that observe a run and change nothing it computes: turning one on (a profile of a
# resumed run's next steps) or a workdir made before it existed is no config change, and no
# run-cache key (core.cache) depends on it.
INSTRUMENTS = ("train.profile", "train.tensorboard")


def without_instruments(config: dict) -> dict:
    """`config` (a nested dict) without the `INSTRUMENTS` fields."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in config.items()}
    for field in INSTRUMENTS:
        section, name = field.split(".")
        if isinstance(out.get(section), dict):
            out[section].pop(name, None)
    return out


def config_diff(old: dict, new: dict) -> list[str]:
    a, b = flatten(without_instruments(old)), flatten(without_instruments(new))
    missing = object()
    return [
        f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k, missing) != b.get(k, missing)
    ]


def check_and_record_config(
    workdir: epath.PathLike, config: dict, *, allow_change: bool, write: bool
) -> None:
    """Refuse a workdir holding another config (unless allowed); record this run's config."""
    config = json.loads(json.dumps(config))  # tuples -> lists, as they come back from disk
    workdir = storage.resolve(workdir)
    path = workdir / "config.json"
    if path.exists():
        try:
            saved = json.loads(path.read_text())
        except ValueError as e:
            raise ConfigError(f"{path} is not valid JSON ({e}); fix or remove it") from None
        diff = config_diff(saved, config)
        if diff and not allow_change:
            raise ConfigError(
                f"workdir {workdir} holds a run with a different config ({'; '.join(diff)}); "
                "use another workdir, or pass --allow_config_change to continue it anyway"
            )
    if write:
        text = json.dumps(config, indent=2)
        for target in (path, new_run_record(workdir)):  # (which creates runs/ and workdir)
            storage.write_atomic(target, text)


def new_run_record(workdir: epath.Path) -> epath.Path:
    """A new path in `<workdir>/runs/`: `<YYYYmmdd-HHMMSS>-<n>-<token>.json`. n counts the
    records of that second already there, so one process's starts never share a name and sort
    in start order; the random token (48 bits) keeps apart processes or hosts that counted the
    same n at once (an object store has no exclusive create to make them take turns, and an
    exists() check would race the same way)."""
    runs = workdir / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    n = len(list(runs.glob(f"{stamp}-*.json")))
    return runs / f"{stamp}-{n:03d}-{uuid.uuid4().hex[:12]}.json"


def _metric_rows(path: epath.Path, up_to_step: int | None):
    """(line, row) of each whole row of metrics.jsonl with step <= up_to_step (None: all)."""
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            if up_to_step is None or row["step"] <= up_to_step:
                yield line, row
        except (ValueError, KeyError, TypeError):
            pass  # a line cut short by a kill


def rewind_metrics(workdir: epath.PathLike, step: int) -> None:
    """Drop metrics rows after `step` (written by a run that died after its last checkpoint):
    the resumed run writes them again, identically."""
    path = storage.resolve(workdir) / "metrics.jsonl"
    if not path.exists():
        return
    kept = [line + "\n" for line, _ in _metric_rows(path, step)]  # a kill may cut the newline
    storage.write_atomic(path, "".join(kept))


def read_metrics(workdir: epath.PathLike) -> list[dict]:
    """Every row of a workdir's metrics.jsonl, earlier sessions' included: `RunResult.history`
    holds only the rows of its own call, so a resumed or restarted run's whole curve is here."""
    path = storage.resolve(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [row for _, row in _metric_rows(path, None)]
