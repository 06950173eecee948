"""JAX's persistent compilation cache, on for the test suite and for `launch.reproduce`.

    from core import compile_cache
    compile_cache.enable()      # before the first compilation

An experiment trains the same program on several seeds, each through its own `core.train.run`
(new closures, so JAX's in-memory cache misses). The persistent cache is keyed by the compiled
program's text, the compile options, the devices and the JAX/XLA versions, so a run that differs
only in seed loads the executable the first one compiled, while any other change (a config, the
code, the device count) is a different key and compiles afresh. It also makes a rerun start fast.

The directory is `$JAX_COMPILATION_CACHE_DIR` if set, else `~/.cache/iclr26-jax`. `enable` first
prunes it to `$ICLR26_COMPILE_CACHE_MAX_BYTES` (default 2 GiB), oldest entries first. JAX's own
cap (`jax_compilation_cache_max_size`) is not used: it rescans and locks the folder on every
write, and once any entry lacks its access-time file (written by a process without the cap) every
later write fails with a warning. The settings
also go into the environment, so processes started from here (launcher tests, multi-process
runs) share the cache. JAX's own warning holds: whoever can write to the directory can make a
process that reads it run arbitrary code, so do not point it at a folder others write to.
"""

import os

DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "iclr26-jax")
# A session of tests and quick runs writes about 100 MB; without a cap the folder only grows.
DEFAULT_MAX_BYTES = 2 * 2**30
ENTRY_SUFFIXES = ("-cache", "-atime")  # the files JAX's cache writes; nothing else is touched

# JAX caches only programs that took over 1 s to compile by default; on CPU the evaluation and
# init programs of the small models take less, and loading them still beats recompiling.
SETTINGS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}


def enable(directory: str | None = None) -> str:
    """Turn the cache on for this process and its children; returns the directory. An explicit
    `directory`, then `$JAX_COMPILATION_CACHE_DIR`, then `DEFAULT_DIR`."""
    directory = directory or os.environ.get("JAX_COMPILATION_CACHE_DIR") or DEFAULT_DIR
    os.environ["JAX_COMPILATION_CACHE_DIR"] = directory
    prune(directory, int(os.environ.get("ICLR26_COMPILE_CACHE_MAX_BYTES", DEFAULT_MAX_BYTES)))
    for name, value in SETTINGS.items():
        os.environ.setdefault(name, value)
    import jax  # after the environment: a first import of JAX reads it

    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update(
        "jax_persistent_cache_min_compile_time_secs",
        float(os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"]),
    )
    jax.config.update(
        "jax_persistent_cache_min_entry_size_bytes",
        int(os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"]),
    )
    return directory


def prune(directory: str, max_bytes: int) -> int:
    """Delete the cache's oldest-written entries until it holds at most `max_bytes`; returns the
    number of bytes freed. A process reading an entry deleted under it recompiles (JAX treats a
    failed read as a miss)."""
    try:
        entries = [
            e for e in os.scandir(directory) if e.is_file() and e.name.endswith(ENTRY_SUFFIXES)
        ]
    except FileNotFoundError:
        return 0
    stats = sorted((e.stat().st_mtime, e.stat().st_size, e.path) for e in entries)
    excess = sum(size for _, size, _ in stats) - max_bytes
    freed = 0
    for _, size, path in stats:
        if freed >= excess:
            break
        try:
            os.remove(path)
        except FileNotFoundError:
            continue  # another process pruned it first
        freed += size
    return freed
