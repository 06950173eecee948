"""The truncated polynomial classifier (TPC): parameters, every truncation, term dropout.

    params = init_params(D, N, R, rng, linear=(w0, w1_D))  # {"w0", "w1", "U", "lam"}
    Y_BN = logits(params, x_BD)            # column j = P_{:j+1}(x), all truncations at once
    T_BN = terms(Y_BN)                     # column j = the order-(j+1) term alone
    logit_B = train_logit(T_BN, order, dropout_p, rng)   # the training logit at `order`
    Y_BN = train_logits_all(T_BN, dropout_p, rng)        # every truncation, one dropout draw
    P_N = param_counts(D, N, R)            # cumulative parameters of each truncation

The order-N polynomial on activations x (symmetric CP, paper eq. 3):

    P_{:n}(x) = w0 + x . w1 + sum_{k=2..n} sum_r lam[k-2, r] (x . U[k-2, r])^k

Shapes: w0 [] and w1 [D] (the linear probe, frozen: `linear.fit`); U [K, R, D] and lam [K, R]
with K = N - 1 (order k is block k - 2). Initialisation as the paper's: U uniform on
+-1/sqrt(D) (torch's `nn.Linear` default), lam ~ N(0, 0.02^2), so every higher term starts
near zero and the untrained polynomial is the linear probe.

Every forward goes through `core.kernels.poly_probe.op` (the fused kernel on TPU/GPU, its jnp
reference on CPU); per-order terms are differences of its consecutive columns. Under a
multi-device mesh being traced (core.train puts it in context) the kernel runs under
`sharded_op`, since XLA cannot partition a Pallas call.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core.kernels import poly_probe
from core.kernels.common import kernel_mesh
from core.mesh import data_axes

LAM_STD = 0.02


def init_params(D: int, N: int, R: int, rng, *, linear=None, lam_std: float = LAM_STD) -> dict:
    """{"w0" [], "w1" [D], "U" [N-1, R, D], "lam" [N-1, R]} float32; `linear` = (w0, w1_D)
    from the linear probe (zeros without it)."""
    if N < 2 or R < 1 or D < 1:
        raise ValueError(f"init_params: need N >= 2, R >= 1, D >= 1; got N={N}, R={R}, D={D}")
    w0, w1 = linear if linear is not None else (0.0, np.zeros(D))
    u_rng, lam_rng = jax.random.split(rng)
    bound = 1.0 / np.sqrt(D)
    return {
        "w0": jnp.asarray(w0, jnp.float32).reshape(()),
        "w1": jnp.asarray(w1, jnp.float32).reshape(D),
        "U": jax.random.uniform(u_rng, (N - 1, R, D), jnp.float32, -bound, bound),
        "lam": lam_std * jax.random.normal(lam_rng, (N - 1, R), jnp.float32),
    }


def _op(impl: str):
    mesh = kernel_mesh(poly_probe.uses_kernel(impl))
    if mesh is None:
        return functools.partial(poly_probe.op, impl=impl)
    axes = data_axes(mesh)
    return functools.partial(poly_probe.sharded_op, mesh=mesh, batch_axes=axes, impl=impl)


def logits(params: dict, x_BD, *, impl: str = "auto") -> jax.Array:
    """Y_BN float32: column j is the truncation P_{:j+1}(x)."""
    return _op(impl)(x_BD, params["w0"], params["w1"], params["U"], params["lam"])


def terms(Y_BN) -> jax.Array:
    """T_BN: column 0 the linear term w0 + x . w1, column j the order-(j+1) term alone."""
    return jnp.concatenate([Y_BN[:, :1], Y_BN[:, 1:] - Y_BN[:, :-1]], axis=1)


def train_logit(terms_BN, order, dropout_p: float, rng) -> jax.Array:
    """The training logit at truncation `order` (an int, or a traced one) with term dropout.

    Every term of order < `order`, the linear term included, is kept with probability 1 - p by
    its own per-example Bernoulli mask, with no 1/(1 - p) rescaling (the paper's code): the
    expected logit is (1 - p) * P_{:order-1} + term_order. The newest term is never dropped;
    terms above `order` are not part of this truncation."""
    N = terms_BN.shape[1]
    j_N = jnp.arange(N)
    older_N = j_N < order - 1
    newest_N = j_N == order - 1
    if dropout_p > 0:
        keep_BN = jax.random.bernoulli(rng, 1.0 - dropout_p, terms_BN.shape)
        weight_BN = jnp.where(older_N, keep_BN, newest_N)
    else:
        weight_BN = jnp.broadcast_to(older_N | newest_N, terms_BN.shape)
    return jnp.sum(jnp.where(weight_BN, terms_BN, 0.0), axis=1)


def train_logits_all(terms_BN, dropout_p: float, rng) -> jax.Array:
    """Y_BN: every truncation's training logit from one term-dropout draw at order N, as the
    released code's `train_all` mode computes them (the forward at the top order, whose masks
    drop each term below N, then the cumulative sums): column j = P_{:j+1} with the same
    dropped terms for every truncation that contains them."""
    N = terms_BN.shape[1]
    j_N = jnp.arange(N)
    if dropout_p > 0:
        keep_BN = jax.random.bernoulli(rng, 1.0 - dropout_p, terms_BN.shape)
        terms_BN = jnp.where(keep_BN | (j_N == N - 1), terms_BN, 0.0)
    return jnp.cumsum(terms_BN, axis=1)


def param_counts(D: int, N: int, R: int) -> np.ndarray:
    """[N] int: parameters of the truncation at each order (linear D + 1, each order R (D + 1)),
    what a cascade that exits there has paid for."""
    return (D + 1) + np.arange(N) * R * (D + 1)


def pair_attribution(params: dict, x_D) -> jax.Array:
    """c_DD with c_ij = (W2_ij + W2_ji) x_i x_j, W2 = sum_r lam_r u_r u_r^T (order 2): the
    contribution of the feature pair (i, j). The upper triangle with the diagonal halved sums
    to the order-2 term."""
    U_RD, lam_R = params["U"][0], params["lam"][0]
    W2_DD = jnp.einsum("r,ri,rj->ij", lam_R, U_RD, U_RD, precision=jax.lax.Precision.HIGHEST)
    return (W2_DD + W2_DD.T) * jnp.outer(x_D, x_D)


def f1_score(y_B, logit_B) -> float:
    """Binary F1 of the positive class at probability 0.5 (logit > 0), as torchmetrics."""
    y = np.asarray(y_B).astype(bool)
    pred = np.asarray(logit_B) > 0
    tp = np.sum(pred & y)
    denom = 2 * tp + np.sum(pred & ~y) + np.sum(~pred & y)
    return float(2 * tp / denom) if denom else 0.0
