"""A run cache keyed by config and code: one expensive run (a seed of a model) computed once.

    value = cache.cached(compute, config=config, code=code_hash, root=f"{workdir}/cache")
    value = cache.cached_run(train_and_evaluate, config, code_hash, workdir, label)

`compute()` returns a JSON-serialisable value (e.g. a run's evaluation rows). It is stored in
`<root>/<key>.json` with the config and code hash beside it, where `key` hashes both: the same
config under the same code is read back, anything else is a different key and is recomputed.
Keying by content rather than by a workdir name (what `methods/csnn/experiment.py` did before)
means an edited hyperparameter or an edited model can never return a stale number, and several
processes can share out a grid: each finished run is a file the others read.

`code` is normally `core.results.code_version(slug)["source_hash"]`: a hash of core's and the
method's sources. A run stays cached across commits that change neither. The key also hashes
the runtime (`environment()`: jax version, platform, device kind and count): the same run on
another backend, or on XLA:CPU split into another number of devices, sums in another order and
gives other numbers (selective_rope's accuracies moved by up to .03 between a plain process and
the test suite's 8 CPU devices), so it is another entry, never a stale one.
"""

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

from core import preemption, workdir
from core.errors import ConfigError


def canonical(config: Any) -> str:
    """The config as sorted, compact JSON (a ConfigDict via its dict), the text that is hashed;
    the instruments (`core.workdir.INSTRUMENTS`: a profile, TensorBoard) left out."""
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if isinstance(config, dict):
        config = workdir.without_instruments(config)
    try:
        return json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=True)
    except TypeError as e:
        raise ConfigError(f"cache key: the config is not JSON-serialisable ({e})") from None


def environment() -> str:
    """The runtime a run's numbers depend on beyond its config and code."""
    import jax

    device = jax.devices()[0]
    return f"jax {jax.__version__} {device.platform} {device.device_kind} x{jax.device_count()}"


def key(config: Any, code: str) -> str:
    text = f"{canonical(config)}\0{code}\0{environment()}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def cached(compute: Callable[[], Any], *, config: Any, code: str, root: str) -> Any:
    """`compute()`'s value for (config, code), read from `root` if an earlier call stored it."""
    text, env = canonical(config), environment()
    path = os.path.join(root, f"{key(config, code)}.json")
    if os.path.exists(path):
        with open(path) as f:
            entry = json.load(f)
        # A hash collision (or a hand-edited file) must not pass for this run's result.
        if (entry["config"], entry["code"], entry.get("environment")) == (text, code, env):
            return entry["value"]
    with preemption.raising():  # a run preempted inside compute() raises at once
        value = compute()
    if preemption.happened():
        # A run inside compute() stopped early on SIGTERM and compute() swallowed its Preempted:
        # its numbers are still not the run's. A rerun resumes the run and stores it then.
        raise preemption.Preempted("preempted: checkpoint saved; rerun to continue")
    os.makedirs(root, exist_ok=True)
    entry = {"config": text, "code": code, "environment": env, "value": value}
    tmp = f"{path}.{os.getpid()}.tmp"  # one per process: two may finish the same run
    with open(tmp, "w") as f:
        json.dump(entry, f, allow_nan=True)
    os.replace(tmp, path)  # never a half-written entry
    return value


def entries(root: str) -> list[Mapping]:
    """Every stored entry under `root` (for inspection and tests)."""
    if not os.path.isdir(root):
        return []
    out = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".json"):
            with open(os.path.join(root, name)) as f:
                out.append(json.load(f))
    return out


def cached_run(
    train_and_evaluate: Callable[[Any, str], Any], config: Any, code: str, workdir: str, label: str
) -> Any:
    """`train_and_evaluate(config, run_dir)` through `cached`: the run trains in
    `<workdir>/runs/<key>` (its checkpoints resume a preempted run) and its value is stored
    under `<workdir>/cache`."""
    print(f"-- {label}: {config.train.steps} steps", flush=True)
    run_dir = os.path.join(workdir, "runs", key(config, code))
    return cached(
        lambda: train_and_evaluate(config, run_dir),
        config=config,
        code=code,
        root=os.path.join(workdir, "cache"),
    )
