"""DOIT's state encoding: PCA of selected layers, fitted once, projected on the device.

Which leaves: those whose "/"-joined path matches `config.doit.layers` (a regex; e.g. the last
two dense kernels of an MLP). PCA per leaf, `components` each: the paper does not say what the
PCA is fitted on; here it is the trajectory of the cold start (one flattened snapshot at the
start of every cold-start cycle, kept on the device in the train state, so it is checkpointed),
fitted once when the cold start ends. From then on every cycle's encoding is
`(flat(W) - mean) @ basis.T` per selected leaf, computed on the device: only
`components * leaves` numbers reach the host.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np

from core.errors import ConfigError
from core.sharding import path_str


def selected(params, pattern: str) -> list:
    """The leaves of `params` whose path matches `pattern`, in tree order."""
    leaves = [
        leaf
        for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]
        if re.search(pattern, path_str(path))
    ]
    if not leaves:
        paths = [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
        raise ConfigError(f"doit.layers={pattern!r} matches no parameter; paths: {paths}")
    return leaves


def initial_snapshots(params, pattern: str, rows: int) -> dict[str, jax.Array]:
    """Snapshot buffers `[rows, size]` per selected leaf, row 0 holding `params`' values."""
    out = {}
    for i, leaf in enumerate(selected(params, pattern)):
        flat = jnp.ravel(leaf).astype(jnp.float32)
        out[str(i)] = jnp.zeros((rows, flat.size), jnp.float32).at[0].set(flat)
    return out


@jax.jit(static_argnames="pattern")
def record(snapshots, params, row, *, pattern):
    """`snapshots` with row `row` set to the selected leaves of `params` (on the device)."""
    leaves = selected(params, pattern)
    return {
        k: snapshots[k].at[row].set(jnp.ravel(leaves[int(k)]).astype(jnp.float32))
        for k in snapshots
    }


def fit(snapshots_host: dict, rows: int, components: int) -> tuple[dict, dict]:
    """(means, bases) per leaf from the first `rows` snapshots: SVD of the centred rows; each
    basis `[components, size]`, zero-padded when fewer directions exist (rows - 1 < k)."""
    means, bases = {}, {}
    for k, snap in snapshots_host.items():
        x = np.asarray(snap[:rows], np.float64)
        mean = x.mean(axis=0)
        _, _, vt = np.linalg.svd(x - mean, full_matrices=False)
        basis = np.zeros((components, x.shape[1]))
        basis[: min(components, vt.shape[0])] = vt[:components]
        # SVD signs are arbitrary; fix them so the encoding is a function of the data alone.
        signs = np.sign(basis[np.arange(components), np.abs(basis).argmax(axis=1)])
        basis *= np.where(signs == 0, 1.0, signs)[:, None]
        means[k], bases[k] = mean.astype(np.float32), basis.astype(np.float32)
    return means, bases


def project_rows(snapshots_host: dict, rows: int, means: dict, bases: dict) -> np.ndarray:
    """Encodings `[rows, components * leaves]` of stored snapshots (the cold start's)."""
    parts = [
        (np.asarray(snapshots_host[k][:rows], np.float32) - means[k]) @ bases[k].T
        for k in sorted(snapshots_host, key=int)
    ]
    return np.concatenate(parts, axis=1)


@jax.jit(static_argnames="pattern")
def project(params, means, bases, *, pattern):
    """The encoding of `params`: every selected leaf projected on its basis, on the device."""
    leaves = selected(params, pattern)
    parts = [
        (jnp.ravel(leaves[int(k)]).astype(jnp.float32) - means[k]) @ bases[k].T
        for k in sorted(means, key=int)
    ]
    return jnp.concatenate(parts)
