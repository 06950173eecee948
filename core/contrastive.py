"""Contrastive embedding training: InfoNCE, last-token pooling, and GradCache's two-pass gradient.

    h_BD = last_valid(hidden_BTD, mask_BT)            # the last non-pad token, any padding side
    loss, metrics = info_nce(q_BD, t_BD, tau=0.02, labels_B=classes)   # q -> t, in-batch
    step = cached_gradient_step(embed, objective, tx, chunks=8)       # a core.train step

InfoNCE here is one-directional (query -> target, as VLM2Vec and Think-Then-Embed train),
cosine similarity of float32-normalised embeddings over a temperature, the batch's other targets
as negatives; `labels_B` removes false negatives (another row with the same label is not a
negative). Under `jit` with the batch sharded over a mesh, `q @ t.T` is over the global batch:
XLA all-gathers the embeddings, so every device's queries see every target (the test checks the
loss on 8 devices equals one device's).

GradCache (Gao et al., 2021): a contrastive loss couples every example of the batch, so it
cannot be microbatched like a mean. Instead: (1) embed every chunk without keeping activations;
(2) the loss and its gradient with respect to the embeddings alone (cheap: [B, D]); (3) per
chunk, re-run the embedder and back-propagate the cached embedding gradient (a VJP), summing
parameter gradients in a `lax.scan`. The gradient equals the full-batch one; peak activation
memory is one chunk's, so the contrastive batch can be far larger than one forward fits.
`embed` must be deterministic (the two passes must agree): no dropout, or its randomness drawn
from the inputs. Chunks are strided (`_chunked`); with the batch sharded over D devices choose
`chunks` so that B / chunks is a multiple of D: each chunk is then split evenly over the devices
and the loop over chunks holds no collective. (With 4-row chunks on 8 CPU devices, the step's
executable deadlocked in an all-gather inside the loop when XLA:CPU loaded it from the
persistent compile cache; freshly compiled it ran. tests/methods/test_tte.py runs 8-row chunks.)
"""

from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import optax

from core.errors import ConfigError
from core.steps import apply_updates


def normalize(x_BD):
    """Unit rows in float32 (a bfloat16 norm at tau = 0.02 would put logit errors of ~0.4)."""
    x = x_BD.astype(jnp.float32)
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def last_valid(h_BTD, mask_BT):
    """Each row's hidden state at its last True mask position (left or right padding alike)."""
    T = mask_BT.shape[1]
    last_B = T - 1 - jnp.argmax(mask_BT[:, ::-1], axis=1)
    return jnp.take_along_axis(h_BTD, last_B[:, None, None], axis=1)[:, 0]


def info_nce(q_BD, t_BD, *, tau: float, labels_B=None):
    """Mean over queries of -log softmax_j(cos(q_i, t_j) / tau)[i]; with labels, targets j != i
    of the same label are left out of row i's denominator. Returns (loss, metrics)."""
    if tau <= 0:
        raise ConfigError(f"info_nce: tau={tau}; must be > 0")
    q, t = normalize(q_BD), normalize(t_BD)
    logits_BB = jnp.matmul(q, t.T, precision=jax.lax.Precision.HIGHEST) / tau
    B = logits_BB.shape[0]
    if labels_B is not None:
        false_negative = (labels_B[:, None] == labels_B[None, :]) & ~jnp.eye(B, dtype=bool)
        logits_BB = jnp.where(false_negative, -jnp.inf, logits_BB)
    positive_B = jnp.diagonal(logits_BB)
    loss_B = jax.nn.logsumexp(logits_BB, axis=1) - positive_B
    accuracy = jnp.mean(jnp.argmax(logits_BB, axis=1) == jnp.arange(B))
    return jnp.mean(loss_B), {"accuracy": accuracy}


def _chunked(x, chunks: int):
    """[B, ...] -> [C, B/C, ...] with chunk c = rows c, c + C, c + 2C, ...: strided, so that with
    the batch sharded over devices in contiguous blocks every chunk holds an equal share of each
    device's rows and the loop over chunks runs on local data (contiguous chunks would each live
    on a few devices and be moved every iteration)."""
    if x.shape[0] % chunks:
        raise ConfigError(f"grad cache: batch of {x.shape[0]} does not split into {chunks} chunks")
    return x.reshape(x.shape[0] // chunks, chunks, *x.shape[1:]).swapaxes(0, 1)


def _unchunked(x_C):
    """`_chunked`'s inverse: [C, B/C, ...] -> [B, ...] in the batch's row order."""
    return x_C.swapaxes(0, 1).reshape(-1, *x_C.shape[2:])


def embed_chunks(embed: Callable, params, chunks_C):
    """Pass 1: embed(params, chunk) for each chunk of a [C, B/C, ...] pytree, as one [B, ...]
    array; only one chunk's activations live at a time."""
    return _unchunked(jax.lax.map(lambda xb: embed(params, xb), chunks_C))


def backprop_chunks(embed: Callable, params, chunks_C, d_emb_C, grads=None):
    """Pass 2: the parameter gradient of sum(embed(params, chunk) * d_emb) over chunks, each
    chunk re-embedded and back-propagated in turn (a `lax.scan`), added to `grads`."""
    if grads is None:
        grads = jax.tree.map(jnp.zeros_like, params)

    def body(g, xs):
        xb, db = xs
        _, vjp = jax.vjp(lambda p: embed(p, xb), params)
        return jax.tree.map(jnp.add, g, vjp(db)[0]), None

    return jax.lax.scan(body, grads, (chunks_C, d_emb_C))[0]


def grad_cache(
    embed: Callable,
    objective: Callable,
    params,
    batch: dict,
    *,
    chunks: int,
    sides: Sequence[str] = ("query", "target"),
):
    """(value, metrics, grads) of `objective(embeddings, batch)` at `params`, where
    embeddings[side] = embed(params, batch[side]) for each side (a pytree of [B, ...] arrays,
    cut into `chunks` along B), by GradCache's two passes; equal to jax.grad of the composed
    function."""
    parts = {s: jax.tree.map(lambda x: _chunked(x, chunks), batch[s]) for s in sides}
    embeddings = {s: embed_chunks(embed, params, parts[s]) for s in sides}
    (value, metrics), d_emb = jax.value_and_grad(lambda e: objective(e, batch), has_aux=True)(
        embeddings
    )
    grads = None
    for side in sides:
        grads = backprop_chunks(embed, params, parts[side], _chunked(d_emb[side], chunks), grads)
    return value, metrics, grads


def cached_gradient_step(
    embed: Callable,
    objective: Callable,
    tx: optax.GradientTransformation,
    *,
    chunks: int,
    sides: Sequence[str] = ("query", "target"),
):
    """A `Method.step` (as `core.steps.gradient_step`) whose gradient comes from `grad_cache`.
    `objective(embeddings, batch) -> (loss, metrics)`, e.g. `info_nce` of the two sides. The
    logged grad_norm is over every leaf; a `core.optim.scoped` tx still leaves its frozen leaves
    untouched."""
    if chunks < 1:
        raise ConfigError(f"grad cache: chunks={chunks} must be >= 1")

    def step(state, batch, *, rng):
        del rng  # embed is deterministic (see the module docstring)
        value, metrics, grads = grad_cache(
            embed, objective, state.params, batch, chunks=chunks, sides=sides
        )
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = apply_updates(tx, state.params, updates)
        metrics = {"loss": value, **metrics, "grad_norm": optax.tree.norm(grads)}
        return state.replace(params=params, opt_state=opt_state), metrics

    return step
