"""Gated linear attention's recurrence, S_t = diag(alpha_t) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t,
in two exact forms: a sequential scan and GLA's chunked form (`mixer.Mixer` uses either).

Shape suffixes: B batch, T time, H heads, K key dim, V value dim, C chunk length, n chunks.
"""

import jax.numpy as jnp
from jax import lax


def gla_scan(q_BTHK, k_BTHK, v_BTHV, log_alpha_BTHK, state_BHKV=None):
    """Gated linear attention by a sequential scan (float32):

        S_t = diag(exp(log_alpha_t)) S_{t-1} + k_t v_t^T,    o_t = S_t^T q_t.

    Returns (o_BTHV, final state S_T [B, H, K, V]). Scaling q is the caller's job.
    """
    B, T, H, K = q_BTHK.shape
    V = v_BTHV.shape[-1]
    if state_BHKV is None:
        state_BHKV = jnp.zeros((B, H, K, V), jnp.float32)

    def step(S_BHKV, xs):
        q, k, v, log_alpha = xs
        S_BHKV = jnp.exp(log_alpha)[..., None] * S_BHKV + k[..., None] * v[..., None, :]
        return S_BHKV, jnp.einsum("bhk,bhkv->bhv", q, S_BHKV)

    time_major = [
        jnp.moveaxis(a.astype(jnp.float32), 1, 0) for a in (q_BTHK, k_BTHK, v_BTHV, log_alpha_BTHK)
    ]
    final, o_TBHV = lax.scan(step, state_BHKV, time_major)
    return jnp.moveaxis(o_TBHV, 0, 1), final


def gla_chunked(q_BTHK, k_BTHK, v_BTHV, log_alpha_BTHK, state_BHKV=None, *, chunk: int = 16):
    """The same recurrence as `gla_scan`, in GLA's chunked form (float32): within a chunk of C
    steps, o_i = sum_{j<=i} sum_k q_ik k_jk exp(g_ik - g_jk) v_j + (q_i * exp(g_i)) S_start, with
    g the in-chunk inclusive cumsum of log alpha (every exponent <= 0, so nothing overflows);
    a `lax.scan` over chunks carries S. T is zero-padded to a multiple of C (no write, no decay).
    """
    B, T, H, K = q_BTHK.shape
    V = v_BTHV.shape[-1]
    C = min(chunk, T)
    n = -(-T // C)
    if state_BHKV is None:
        state_BHKV = jnp.zeros((B, H, K, V), jnp.float32)

    def chunks(x):  # [B, T, H, X] -> [n, B, H, C, X]
        x = jnp.pad(x.astype(jnp.float32), ((0, 0), (0, n * C - T), (0, 0), (0, 0)))
        return x.reshape(B, n, C, H, -1).transpose(1, 0, 3, 2, 4)

    q, k, v, log_alpha = map(chunks, (q_BTHK, k_BTHK, v_BTHV, log_alpha_BTHK))
    g = jnp.cumsum(log_alpha, axis=3)  # [n, B, H, C, K], decreasing within a chunk
    causal_CC = jnp.tril(jnp.ones((C, C), bool))[:, :, None]
    diff = g[:, :, :, :, None, :] - g[:, :, :, None, :, :]  # (i, j): g_i - g_j <= 0 for j <= i
    decay = jnp.where(causal_CC, jnp.exp(jnp.where(causal_CC, diff, 0.0)), 0.0)
    scores = jnp.einsum("nbhik,nbhjk,nbhijk->nbhij", q, k, decay)
    o_intra = jnp.einsum("nbhij,nbhjv->nbhiv", scores, v)
    q_from_start = q * jnp.exp(g)  # decay from the chunk's start to i
    g_last = g[:, :, :, -1:]  # [n, B, H, 1, K]
    k_to_end = k * jnp.exp(g_last - g)  # decay from j to the chunk's end

    def step(S_BHKV, xs):
        q_c, k_c, v_c, g_last_c = xs
        o_c = jnp.einsum("bhik,bhkv->bhiv", q_c, S_BHKV)
        S_BHKV = jnp.exp(g_last_c[:, :, 0])[..., None] * S_BHKV + jnp.einsum(
            "bhjk,bhjv->bhkv", k_c, v_c
        )
        return S_BHKV, o_c

    final, o_inter = lax.scan(step, state_BHKV, (q_from_start, k_to_end, v, g_last))
    o = (o_intra + o_inter).transpose(1, 0, 3, 2, 4).reshape(B, n * C, H, V)
    return o[:, :T], final
