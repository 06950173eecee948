"""The persistent compilation cache is pruned to its cap, oldest entries first
(core.compile_cache)."""

import os
import subprocess
import sys

from core import compile_cache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def fill(directory, sizes: list[int]) -> list[str]:
    """Entries of the given sizes, each written one second after the one before."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for i, size in enumerate(sizes):
        path = os.path.join(directory, f"jit_f{i}-{i:064x}-cache")
        with open(path, "wb") as f:
            f.write(b"x" * size)
        os.utime(path, (1_000_000 + i, 1_000_000 + i))
        paths.append(path)
    return paths


def test_prune_deletes_the_oldest_entries_down_to_the_cap_and_nothing_else(tmp_path):
    paths = fill(tmp_path, [100, 200, 300, 400])
    other = tmp_path / "notes.txt"  # not a cache entry: never deleted
    other.write_text("keep")
    assert compile_cache.prune(str(tmp_path), 700) == 300  # 1000 bytes -> the two oldest go
    assert [os.path.exists(p) for p in paths] == [False, False, True, True]
    assert other.exists()
    assert compile_cache.prune(str(tmp_path), 700) == 0  # already under the cap
    assert compile_cache.prune(str(tmp_path / "absent"), 0) == 0


def test_enable_prunes_to_the_cap_from_the_environment(tmp_path):
    paths = fill(tmp_path, [100, 100, 100])
    env = {**os.environ, "ICLR26_COMPILE_CACHE_MAX_BYTES": "150", "JAX_PLATFORMS": "cpu"}
    script = "import sys; from core import compile_cache; compile_cache.enable(sys.argv[1])"
    subprocess.run([sys.executable, "-c", script, str(tmp_path)], cwd=REPO, env=env, check=True)
    assert [os.path.exists(p) for p in paths] == [False, False, True]
