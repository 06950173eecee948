"""Calibration-set selection from a pool of model inputs: uniform, k-means, and TAP (Q&C's
temporal-aware parallel clustering, the paper's Algorithm 1 with our concrete choices).

TAP: m subsamples of the pool (each element kept with probability `fraction`; the paper: 3 of
1/20 each). In each, the affinity

    A = alpha max(cos(x_k, x_h), 0) + (1 - alpha) exp(-|t_k - t_h| / time_unit)

(negative cosines clipped at 0 so no affinity is negative; the diagonal is 1, so every degree is
positive), the normalised L = D^-1/2 A D^-1/2, its top-k eigenvectors with rows scaled to unit
length (Ng, Jordan and Weiss), and k-means on those rows. The paper leaves open how the m
clusterings are aggregated; our choice: every (subsample, cluster) pair is a group, and the
selection draws round-robin over the groups (each gives one random member not yet chosen), so
every cluster of every subsample is represented, as "samples drawn per cluster" asks. Cost:
m affinities and eighs of n = fraction * N rows, O(m n^2) memory, instead of O(N^3).

With integer sampler steps and time_unit = 1 the temporal term is exp(-1) for neighbouring
steps and below exp(-5) < 0.007 five steps apart: clusters stay local in time.
k-means: k-means++ seeding, Lloyd iterations until no label changes; an emptied cluster is
re-seeded at the point farthest from its centroid. Pure NumPy, seeded by the `rng` argument.
"""

import numpy as np

from core.errors import ConfigError


def _check(name, ok, value):
    # ConfigError is a ValueError: one line naming the method, the argument and its value.
    if not ok:
        raise ConfigError(f"quant_cache calibration selection: {name}={value!r} is out of range")


def uniform_select(num_pool, n_select, *, rng):
    """n_select pool indices uniformly without replacement (sorted)."""
    _check("n_select", 0 < n_select <= num_pool, n_select)
    return np.sort(rng.choice(num_pool, n_select, replace=False))


def kmeans(x_ND, k, *, rng, iters=100):
    """(labels [N], centroids [k, D]) of k-means (module docstring)."""
    x = np.asarray(x_ND, np.float64)
    n = len(x)
    _check("k", 1 <= k <= n, k)
    centroids = [x[rng.integers(n)]]
    d2 = np.sum((x - centroids[0]) ** 2, axis=1)
    for _ in range(1, k):
        p = d2 / d2.sum() if d2.sum() > 0 else np.full(n, 1 / n)
        centroids.append(x[rng.choice(n, p=p)])
        d2 = np.minimum(d2, np.sum((x - centroids[-1]) ** 2, axis=1))
    c = np.stack(centroids)
    labels = None
    for _ in range(iters):
        dist = np.sum(x**2, 1)[:, None] - 2 * x @ c.T + np.sum(c**2, 1)[None]
        new = np.argmin(dist, axis=1)
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        for j in range(k):
            members = x[labels == j]
            if len(members):
                c[j] = members.mean(0)
            else:  # re-seed at the point worst served by its centroid
                c[j] = x[np.argmax(dist[np.arange(n), labels])]
    return labels, c


def affinity(x_ND, t_N, *, alpha=0.5, time_unit=1.0):
    """A [N, N] (float64): alpha clipped cosine + (1 - alpha) exp(-|dt| / time_unit)."""
    _check("alpha", 0 <= alpha <= 1, alpha)
    _check("time_unit", time_unit > 0, time_unit)
    x = np.asarray(x_ND, np.float64)
    u = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    spatial = np.maximum(u @ u.T, 0.0)
    t = np.asarray(t_N, np.float64)
    temporal = np.exp(-np.abs(t[:, None] - t[None]) / time_unit)
    return alpha * spatial + (1 - alpha) * temporal


def normalized(A_NN):
    """L = D^-1/2 A D^-1/2 (D the degrees; A symmetric, so row and column degrees agree): its
    largest eigenvalue is 1, with eigenvector sqrt(d)."""
    inv = 1 / np.sqrt(A_NN.sum(1))
    return inv[:, None] * A_NN * inv[None]


def spectral_labels(A_NN, k, *, rng):
    """Cluster labels of A's rows: normalised affinity, top-k eigenvectors, k-means."""
    _, vecs = np.linalg.eigh(normalized(A_NN))
    emb = vecs[:, -k:]
    emb = emb / np.maximum(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12)
    return kmeans(emb, k, rng=rng)[0]


def round_robin(groups, n_select, *, rng):
    """n_select distinct indices drawn one per group in turn (sorted)."""
    queues = [list(rng.permutation(g)) for g in groups if len(g)]
    chosen, seen = [], set()
    total = len(set(np.concatenate(groups).tolist())) if groups else 0
    _check("n_select", 0 < n_select <= total, n_select)
    while len(chosen) < n_select:
        for q in queues:
            while q and q[-1] in seen:
                q.pop()
            if q and len(chosen) < n_select:
                item = q.pop()
                seen.add(item)
                chosen.append(item)
    return np.sort(np.asarray(chosen))


def tap_select(
    x_ND, t_N, n_select, *, k, rng, subsamples=3, fraction=1 / 20, alpha=0.5, time_unit=1.0
):
    """TAP's selection (module docstring): sorted unique pool indices."""
    n = len(x_ND)
    _check("k", k >= 1, k)
    _check("subsamples", subsamples >= 1, subsamples)
    _check("fraction", 0 < fraction <= 1, fraction)
    _check("n_select", 0 < n_select <= n, n_select)
    groups = []
    for _ in range(subsamples):
        rows = np.flatnonzero(rng.random(n) < fraction)
        if len(rows) <= k:
            raise ConfigError(
                f"quant_cache TAP: a subsample of {len(rows)} rows cannot hold k={k} clusters "
                f"(pool {n}, fraction {fraction}): use a larger pool or fraction"
            )
        labels = spectral_labels(
            affinity(x_ND[rows], t_N[rows], alpha=alpha, time_unit=time_unit), k, rng=rng
        )
        groups += [rows[labels == j] for j in range(k)]
    return round_robin(groups, n_select, rng=rng)


def kmeans_select(x_ND, n_select, *, k, rng):
    """k-means on the inputs, then one member per cluster in turn (sorted indices)."""
    labels, _ = kmeans(x_ND, k, rng=rng)
    return round_robin([np.flatnonzero(labels == j) for j in range(k)], n_select, rng=rng)
