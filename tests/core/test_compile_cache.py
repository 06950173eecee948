"""The persistent compilation cache is capped by default and stays under its cap
(core.compile_cache)."""

import os
import subprocess
import sys
import textwrap

from core import compile_cache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# In a fresh process (JAX builds its cache object once, at the first compilation): enable the
# cache with its default settings and print the cap JAX got; then lower the cap to argv[2] bytes
# (before anything compiles), compile 12 distinct programs and print the bytes and the number of
# entries left in the folder.
SCRIPT = textwrap.dedent(
    """
    import os, sys
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.pop("JAX_COMPILATION_CACHE_MAX_SIZE", None)
    from core import compile_cache
    directory = compile_cache.enable(sys.argv[1])
    import jax, jax.numpy as jnp
    print(jax.config.jax_compilation_cache_max_size)
    jax.config.update("jax_compilation_cache_max_size", int(sys.argv[2]))
    for n in range(12):
        jax.jit(lambda x, n=n: jnp.sin(x) * n + jnp.cumsum(x)).lower(jnp.ones(64 + n)).compile()
    entries = [e for e in os.scandir(directory) if e.name.endswith("-cache")]
    print(sum(e.stat().st_size for e in entries), len(entries))
    """
)


def test_the_cache_has_a_default_cap_and_evicts_beyond_it(tmp_path):
    cap = 40_000  # bytes: a few of these programs' entries (each ~10-20 kB on XLA:CPU)
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(cap)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    default_cap, sizes = out.stdout.strip().splitlines()
    assert int(default_cap) == int(compile_cache.SETTINGS["JAX_COMPILATION_CACHE_MAX_SIZE"]) > 0
    size, count = map(int, sizes.split())
    assert 0 < count < 12  # some entries were written, older ones evicted
    assert size <= cap
