"""JAX's persistent compilation cache, on for the test suite and for `launch.reproduce`.

    from core import compile_cache
    compile_cache.enable()      # before the first compilation

An experiment trains the same program on several seeds, each through its own `core.train.run`
(new closures, so JAX's in-memory cache misses). The persistent cache is keyed by the compiled
program's text, the compile options, the devices and the JAX/XLA versions, so a run that differs
only in seed loads the executable the first one compiled, while any other change (a config, the
code, the device count) is a different key and compiles afresh. It also makes a rerun start fast.

The directory is `$JAX_COMPILATION_CACHE_DIR` if set, else `~/.cache/iclr26-jax`. It is capped
at `$JAX_COMPILATION_CACHE_MAX_SIZE` bytes (default 2 GiB; -1: no cap), least recently used
entries evicted first (JAX's own LRU, which locks the folder with `filelock`). The settings
also go into the environment, so processes started from here (launcher tests, multi-process
runs) share the cache. JAX's own warning holds: whoever can write to the directory can make a
process that reads it run arbitrary code, so do not point it at a folder others write to.
"""

import os

DEFAULT_DIR = os.path.join(os.path.expanduser("~"), ".cache", "iclr26-jax")

# JAX caches only programs that took over 1 s to compile by default; on CPU the evaluation and
# init programs of the small models take less, and loading them still beats recompiling.
SETTINGS = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    # A session of tests and quick runs writes about 100 MB; without a cap the folder only grows.
    "JAX_COMPILATION_CACHE_MAX_SIZE": str(2 * 2**30),
}


def enable(directory: str | None = None) -> str:
    """Turn the cache on for this process and its children; returns the directory. An explicit
    `directory`, then `$JAX_COMPILATION_CACHE_DIR`, then `DEFAULT_DIR`."""
    directory = directory or os.environ.get("JAX_COMPILATION_CACHE_DIR") or DEFAULT_DIR
    os.environ["JAX_COMPILATION_CACHE_DIR"] = directory
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
    jax.config.update(
        "jax_compilation_cache_max_size", int(os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"])
    )
    return directory
