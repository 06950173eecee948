"""The inverse-CDF arithmetic of Parallel Token Prediction: one sampling transform, the teacher's
bin edges, auxiliary variables drawn inside a bin, picking a token from u, and verification.

    probs_V = sampling_probs(logits_V, transform)      # temperature / top-k / top-p, float32
    edges_E = cdf_edges(probs_V)                       # E = V + 1; token j owns [E[j], E[j+1])
    left, right = token_bin(edges_E, token)
    u = u_in_bin(left, right, z)                       # z ~ Beta(.3, .3) (train), U(0, 1) (eval)
    pick(edges_E, u) == token                          # for every token with a non-empty bin

Sampling a token is t = pick(P, u) with u ~ U(0, 1): the inverse CDF over vocabulary ids in
index order. Given u the token is deterministic, which is what lets a student fed the u's emit
many tokens in one call (O-PTP) and a teacher check them losslessly (`verify`).

Why the edges are built the way they are:
- One `sampling_probs` (the shared sampler's `filter_logits`, then softmax) serves the edges
  of training and the teacher's picks in verification: a temperature, top-k or top-p applied
  in one and not the other moves every bin (the tests show the verified output then leaves
  the teacher's distribution).
- float32 throughout, in vocabulary order (sorting by probability would give other bins).
- Edges are the cumulative sum divided by its own last element, so the last edge is exactly
  1.0 (x / x == 1 in IEEE arithmetic) and every u in [0, 1) picks a token of non-zero width;
  the division is monotone, so bins never cross. A token's left edge is the previous token's
  right edge (the same float), never `cumsum - p`, which rounds differently and could leave a
  gap or an overlap between neighbours.
- `u_in_bin` clamps into [left, nextafter(right, 0)]: left + (right - left) * z rounds to
  `right` for z near 1 (Beta(.3, .3) puts mass there), and `right` already belongs to the next
  token. Bins narrower than 1e-6 (a few float32 ulps wide) decode correctly this way. A bin
  narrower than the float32 spacing at its edge has width 0: the float32 sampler can never emit
  that token, so it is never a teacher sample (the tests count such bins as empty).

Shape suffixes: B batch, L completion slots, V vocabulary, E = V + 1 edges.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from core.nn import sampler


class SamplingTransform(NamedTuple):
    """How the teacher's logits become its sampling distribution (None / 0 / 1.0: off)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0


PLAIN = SamplingTransform()  # the teacher's own distribution


def sampling_probs(logits_V: jax.Array, transform: SamplingTransform = PLAIN):
    """float32 probabilities [..., V] in vocabulary order after temperature, top-k, top-p.

    The filter is the shared sampler's (`core.nn.sampler.filter_logits`): top-k keeps exactly k
    tokens (ties broken towards the lower token id), top-p keeps the most probable tokens up
    to and including the one whose cumulative probability first reaches p (the official
    code's rule), then the kept logits are renormalised. Losslessness needs only that edges
    and verification apply the same transform, which one function guarantees."""
    logits_V = logits_V.astype(jnp.float32)
    if transform.temperature != 1.0:
        logits_V = logits_V / jnp.float32(transform.temperature)
    filtered_V = sampler.filter_logits(logits_V, top_k=transform.top_k, top_p=transform.top_p)
    return jax.nn.softmax(filtered_V, axis=-1)


def cdf_edges(probs_V: jax.Array) -> jax.Array:
    """The V + 1 bin edges [..., E] of float32 `probs_V`: 0, then the CDF scaled to end at 1."""
    cdf_V = jnp.cumsum(probs_V.astype(jnp.float32), axis=-1)
    cdf_V = cdf_V / cdf_V[..., -1:]
    return jnp.concatenate([jnp.zeros_like(cdf_V[..., :1]), cdf_V], axis=-1)


def token_bin(edges_E: jax.Array, tokens: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(left, right) edges of `tokens`' bins; edges_E [..., E], tokens [...] (same leading)."""
    left = jnp.take_along_axis(edges_E, tokens[..., None], axis=-1)[..., 0]
    right = jnp.take_along_axis(edges_E, tokens[..., None] + 1, axis=-1)[..., 0]
    return left, right


def u_in_bin(left: jax.Array, right: jax.Array, z: jax.Array) -> jax.Array:
    """left + (right - left) * z for z in [0, 1], kept inside the half-open bin [left, right)."""
    u = left + (right - left) * z.astype(jnp.float32)
    return jnp.clip(u, left, jnp.maximum(jnp.nextafter(right, jnp.float32(0)), left))


def pick(edges_E: jax.Array, u: jax.Array) -> jax.Array:
    """The token whose bin holds u (the inverse CDF): #{j : edges[j + 1] <= u}, by binary
    search per distribution; edges_E [..., E], u [...] (same leading shape), int32."""
    lead = u.shape
    flat_E = edges_E.reshape(-1, edges_E.shape[-1])
    search = jax.vmap(lambda e, x: jnp.searchsorted(e[1:], x, side="right"))
    return search(flat_E, u.reshape(-1)).reshape(lead).astype(jnp.int32)


def bins_of(probs_BLV, tokens_BL):
    """(left, right) [B, L] of each token's bin under its position's distribution."""
    return token_bin(cdf_edges(probs_BLV), tokens_BL)


def sample_u(rng, left, right, *, train: bool, concentration: float = 0.3):
    """u inside each bin: z ~ Beta(c, c) in training (mass near the edges, where a student's
    mistakes are), z ~ U(0, 1) in evaluation (what sampling the teacher gives)."""
    if train:
        z = jax.random.beta(rng, concentration, concentration, left.shape, jnp.float32)
    else:
        z = jax.random.uniform(rng, left.shape, jnp.float32)
    return u_in_bin(left, right, z)


class Verified(NamedTuple):
    tokens_BK: jax.Array  # the teacher's picks y_1..y_{L+1} (K = L + 1)
    num_accepted_B: jax.Array  # m + 1: the matching prefix of the proposal plus one teacher token


def leading_matches(a_BL: jax.Array, b_BL: jax.Array) -> jax.Array:
    """How many leading positions agree, per row (the `correct` metric's count)."""
    return jnp.sum(jnp.cumprod(a_BL == b_BL, axis=-1), axis=-1).astype(jnp.int32)


def verify(teacher_probs_BKV, proposal_BL, u_BK) -> Verified:
    """Lossless verification of a proposal x_1..x_L drawn with u_1..u_L.

    teacher_probs_BKV: the teacher's sampling distributions (after the same `sampling_probs`
    transform as the edges) at the L + 1 positions after the context, conditioned on the
    context and x_<k (one teacher call over context + proposal). u_BK: the L + 1 auxiliaries,
    the first L the ones the student saw. The teacher picks y_k = pick(P_k, u_k); the accepted
    tokens are y_1..y_{m+1}, m the number of leading k with x_k = y_k: as long as x_<k = y_<k,
    y_k is exactly the teacher's own sample given u_k, whatever the student proposed."""
    teacher_BK = pick(cdf_edges(teacher_probs_BKV), u_BK)
    m_B = leading_matches(proposal_BL, teacher_BK[:, : proposal_BL.shape[1]])
    return Verified(teacher_BK, m_B + 1)
