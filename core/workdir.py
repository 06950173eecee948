"""Workdir bookkeeping: the config of every run, refusal of a mismatched one, metrics rewind.

`<workdir>/config.json` is the config the run's checkpoints belong to. Starting in a workdir that
holds a different config is refused with the differing fields listed, unless the caller allows
it (then config.json is updated). Every start is recorded in `<workdir>/runs/`, so the config of
every run is kept.
"""

import json
import os
import time
from typing import Any

from core.errors import ConfigError


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: list(tree) if isinstance(tree, tuple) else tree}


def config_diff(old: dict, new: dict) -> list[str]:
    a, b = flatten(old), flatten(new)
    missing = object()
    return [
        f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
        for k in sorted(set(a) | set(b))
        if a.get(k, missing) != b.get(k, missing)
    ]


def check_and_record_config(workdir: str, config: dict, *, allow_change: bool, write: bool) -> None:
    """Refuse a workdir holding another config (unless allowed); record this run's config."""
    config = json.loads(json.dumps(config))  # tuples -> lists, as they come back from disk
    path = os.path.join(workdir, "config.json")
    if os.path.exists(path):
        with open(path) as f:
            try:
                saved = json.load(f)
            except ValueError as e:
                raise ConfigError(f"{path} is not valid JSON ({e}); fix or remove it") from None
        diff = config_diff(saved, config)
        if diff and not allow_change:
            raise ConfigError(
                f"workdir {workdir} holds a run with a different config ({'; '.join(diff)}); "
                "use another workdir, or pass --allow_config_change to continue it anyway"
            )
    if write:
        os.makedirs(os.path.join(workdir, "runs"), exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for target in (path, os.path.join(workdir, "runs", f"{stamp}-{os.getpid()}.json")):
            tmp = f"{target}.tmp"
            with open(tmp, "w") as f:
                json.dump(config, f, indent=2)
            os.replace(tmp, target)


def rewind_metrics(workdir: str, step: int) -> None:
    """Drop metrics rows after `step` (written by a run that died after its last checkpoint):
    the resumed run writes them again, identically."""
    path = os.path.join(workdir, "metrics.jsonl")
    if not os.path.exists(path):
        return
    with open(path) as f:
        lines = f.readlines()
    kept = []
    for line in lines:
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            pass  # a line cut short by the kill
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.writelines(kept)
    os.replace(tmp, path)
