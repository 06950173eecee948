"""Top-k ranking metrics for item-item recommenders: Recall@k and NDCG@k.

    m = evaluate(W_II, fold_in_UI, held_out_UI, k=20)    # {"recall": float, "ndcg": float}
    u = per_user(W_II, fold_in_UI, held_out_UI, k=20)    # {"recall": [U], "ndcg": [U]}, nan
    per_user = topk_metrics(scores_BI, fold_in_BI, held_out_BI, k=20)

Protocol (Liang et al. 2018, as in the DEQL paper): scores are fold_in @ W; the fold-in items
are set to -inf before top-k (recommending what the user already has is no hit); Recall@k =
hits / min(k, #held-out), so a user with fewer than k held-out items can reach 1; NDCG@k
divides by the ideal DCG of min(k, #held-out) hits. Users without held-out items are left out
of the means (their metrics are undefined, not zero; `per_user` gives them nan).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from core.errors import ConfigError


@functools.partial(jax.jit, static_argnames="k")
def topk_metrics(scores_BI, fold_in_BI, held_out_BI, k: int) -> dict:
    """Per-user {"recall": [B], "ndcg": [B]} (0 for users without held-out items)."""
    scores_BI = jnp.where(fold_in_BI > 0, -jnp.inf, scores_BI)
    _, top_BK = jax.lax.top_k(scores_BI, k)
    hits_BK = jnp.take_along_axis(held_out_BI > 0, top_BK, axis=1).astype(jnp.float32)
    n_out_B = jnp.sum(held_out_BI > 0, axis=1)
    n_ideal_B = jnp.minimum(n_out_B, k)
    discount_K = 1.0 / jnp.log2(jnp.arange(2, k + 2, dtype=jnp.float32))
    ideal_B = jnp.sum(discount_K[None, :] * (jnp.arange(k)[None, :] < n_ideal_B[:, None]), axis=1)
    safe = lambda d_B: jnp.maximum(d_B, 1e-12)  # a user without held-out items scores 0, not nan
    return {
        "recall": jnp.sum(hits_BK, axis=1) / safe(n_ideal_B.astype(jnp.float32)),
        "ndcg": jnp.sum(hits_BK * discount_K[None, :], axis=1) / safe(ideal_B),
    }


def per_user(W_II, fold_in_UI, held_out_UI, k: int, batch_size: int = 1024) -> dict:
    """Per-user {"recall": [U], "ndcg": [U]} float64 (nan for users without held-out items), in
    batches of users (the scores of all users at once would be users x items floats). Inputs:
    dense or scipy sparse."""
    n_users, n_items = fold_in_UI.shape
    if held_out_UI.shape != fold_in_UI.shape or np.shape(W_II) != (n_items, n_items):
        raise ConfigError(
            f"shapes fold_in {fold_in_UI.shape}, held_out {held_out_UI.shape}, W "
            f"{np.shape(W_II)} disagree; expected [U, I], [U, I], [I, I]"
        )
    if not 0 < k <= n_items:
        raise ConfigError(f"k={k}: must be in [1, {n_items}] (the number of items)")
    W_II = jnp.asarray(W_II, jnp.float32)  # ranking only; float32 scores suffice
    dense = lambda M: np.asarray(M.toarray() if sp.issparse(M) else M, np.float32)
    out = {"recall": np.full(n_users, np.nan), "ndcg": np.full(n_users, np.nan)}
    for lo in range(0, n_users, batch_size):
        x_BI = dense(fold_in_UI[lo : lo + batch_size])
        y_BI = dense(held_out_UI[lo : lo + batch_size])
        m = topk_metrics(jnp.asarray(x_BI) @ W_II, x_BI, y_BI, k)
        valid_B = np.asarray((y_BI > 0).any(axis=1))
        for name, values in out.items():
            values[lo : lo + len(x_BI)] = np.where(valid_B, np.asarray(m[name], np.float64), np.nan)
    return out


def evaluate(W_II, fold_in_UI, held_out_UI, k: int, batch_size: int = 1024) -> dict:
    """Mean Recall@k and NDCG@k over the users with held-out items (`per_user`'s non-nan)."""
    users = per_user(W_II, fold_in_UI, held_out_UI, k, batch_size)
    if np.all(np.isnan(users["recall"])):
        raise ConfigError("no user has held-out items: the metrics are undefined")
    return {name: float(np.nanmean(values)) for name, values in users.items()}
