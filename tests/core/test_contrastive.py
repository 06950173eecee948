"""core.contrastive: InfoNCE by hand, false negatives, the loss on a mesh, last-token pooling,
GradCache's gradient and memory, and its step through core.train's state."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from core import contrastive
from core.errors import ConfigError
from core.state import TrainState


def test_info_nce_matches_a_hand_computation():
    q = np.array([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]])
    t = np.array([[3.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    tau = 0.5
    # cos(q_i, t_j): row 0 (1, 1/sqrt2, 0), row 1 (0, 1/sqrt2, 1), row 2 (1/sqrt2, 1, 1/sqrt2)
    r = 1 / np.sqrt(2)
    cos = np.array([[1, r, 0], [0, r, 1], [r, 1, r]])
    expected = np.mean([np.log(np.exp(cos[i] / tau).sum()) - cos[i, i] / tau for i in range(3)])
    loss, metrics = contrastive.info_nce(jnp.asarray(q), jnp.asarray(t), tau=tau)
    np.testing.assert_allclose(float(loss), expected, rtol=1e-6)  # float32 of O(1) numbers
    assert float(metrics["accuracy"]) == pytest.approx(1 / 3)  # rows 1, 2 prefer t_2, t_1


def test_a_false_negative_changes_exactly_its_term():
    rng = np.random.default_rng(0)
    q, t = rng.normal(size=(4, 8)), rng.normal(size=(4, 8))
    tau = 0.1
    logits = contrastive.normalize(q) @ contrastive.normalize(t).T / tau
    rows = lambda lg: np.asarray(jax.nn.logsumexp(lg, 1) - jnp.diagonal(lg))  # noqa: E731
    plain = rows(logits)
    labels = jnp.array([0, 1, 0, 2])  # rows 0 and 2 share a label: t_2 leaves row 0, t_0 row 2
    loss, _ = contrastive.info_nce(jnp.asarray(q), jnp.asarray(t), tau=tau, labels_B=labels)
    masked = np.asarray(logits).copy()
    masked[0, 2] = masked[2, 0] = -np.inf
    expected = rows(jnp.asarray(masked))
    assert np.allclose(expected[[1, 3]], plain[[1, 3]]) and not np.allclose(expected, plain)
    np.testing.assert_allclose(float(loss), expected.mean(), rtol=1e-5)
    with pytest.raises(ConfigError, match="tau=0"):
        contrastive.info_nce(jnp.asarray(q), jnp.asarray(t), tau=0)


def test_the_loss_over_a_mesh_equals_one_device():
    # The batch sharded over 8 devices: q @ t.T is over the global batch (XLA gathers the
    # embeddings), so each query still sees all 64 targets.
    rng = np.random.default_rng(1)
    q, t = (
        rng.normal(size=(64, 16)).astype(np.float32),
        rng.normal(size=(64, 16)).astype(np.float32),
    )
    labels = rng.integers(0, 10, 64)
    fn = jax.jit(lambda a, b, c: contrastive.info_nce(a, b, tau=0.02, labels_B=c)[0])
    one = float(fn(q, t, labels))
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))  # as core.mesh
    shard = NamedSharding(mesh, PartitionSpec("data"))
    many = float(fn(*(jax.device_put(x, shard) for x in (q, t, labels))))
    # float32 sums over 64 targets in another order; logits up to 1/0.02 = 50
    np.testing.assert_allclose(many, one, rtol=1e-5)


def test_last_valid_reads_the_last_non_pad_token_under_either_padding():
    h = jnp.arange(2 * 5 * 1, dtype=jnp.float32).reshape(2, 5, 1)
    right = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    left = jnp.array([[0, 0, 1, 1, 1], [0, 1, 1, 1, 1]], bool)
    assert contrastive.last_valid(h, right)[:, 0].tolist() == [2.0, 9.0]
    assert contrastive.last_valid(h, left)[:, 0].tolist() == [4.0, 9.0]


def _mlp(hidden):
    def init(key):
        k1, k2 = jax.random.split(key)
        return {
            "w1": jax.random.normal(k1, (32, hidden)) / 6,
            "w2": jax.random.normal(k2, (hidden, 8)) / 6,
        }

    def embed(p, x_BF):
        return jnp.tanh(x_BF @ p["w1"]) @ p["w2"]

    return init, embed


def _objective(e, batch):
    return contrastive.info_nce(e["query"], e["target"], tau=0.05, labels_B=batch["labels"])


def _batch(n, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "query": jnp.asarray(rng.normal(size=(n, 32)), jnp.float32),
        "target": jnp.asarray(rng.normal(size=(n, 32)), jnp.float32),
        "labels": jnp.asarray(rng.integers(0, 5, n)),
    }


def test_grad_cache_equals_the_full_batch_gradient():
    init, embed = _mlp(64)
    params, batch = init(jax.random.key(0)), _batch(32)

    def full(p):
        e = {s: embed(p, batch[s]) for s in ("query", "target")}
        return _objective(e, batch)

    (value, _), grads = jax.value_and_grad(full, has_aux=True)(params)
    c_value, _, c_grads = jax.jit(
        lambda p: contrastive.grad_cache(embed, _objective, p, batch, chunks=4)
    )(params)
    # float32; the cached path sums the chunks' VJPs in another order (relative 1e-5 of the
    # gradient's scale)
    np.testing.assert_allclose(float(c_value), float(value), rtol=1e-6)
    for k in grads:
        scale = float(jnp.abs(grads[k]).max())
        np.testing.assert_allclose(np.asarray(c_grads[k]), np.asarray(grads[k]), atol=1e-5 * scale)
    with pytest.raises(ConfigError, match="does not split into 5 chunks"):
        contrastive.grad_cache(embed, _objective, params, batch, chunks=5)


def _temp_bytes(fn, *args):
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_the_second_pass_memory_does_not_grow_with_the_batch():
    # Wide activations (2048 per example) against 8-number embeddings. Back-propagating cached
    # embedding gradients through the whole batch at once keeps every example's activations;
    # chunk by chunk (32 examples each) keeps one chunk's, so 8x the batch costs about as much.
    init, embed = _mlp(2048)
    params = init(jax.random.key(0))

    def whole(p, x_BF, d_BD):
        return jax.vjp(lambda p: embed(p, x_BF), p)[1](d_BD)[0]

    def chunked(p, x_BF, d_BD):
        n = x_BF.shape[0] // 32
        return contrastive.backprop_chunks(
            embed, p, x_BF.reshape(n, 32, -1), d_BD.reshape(n, 32, -1)
        )

    def growth(fn):
        sizes = [
            _temp_bytes(fn, params, jnp.zeros((b, 32)), jnp.zeros((b, 8))) for b in (128, 1024)
        ]
        return sizes[1] / sizes[0]

    assert growth(whole) > 4
    assert growth(chunked) < 1.2


def test_cached_step_updates_params_like_a_plain_gradient_step():
    init, embed = _mlp(64)
    params, batch = init(jax.random.key(0)), _batch(32)
    tx = optax.sgd(0.1)
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        rng=jax.random.key(1),
        params=params,
        opt_state=tx.init(params),
        extra={},
    )
    step = contrastive.cached_gradient_step(embed, _objective, tx, chunks=2)
    new, metrics = jax.jit(lambda s: step(s, batch, rng=None))(state)
    grads = jax.grad(
        lambda p: _objective({s: embed(p, batch[s]) for s in ("query", "target")}, batch)[0]
    )(params)
    for k in params:
        np.testing.assert_allclose(
            np.asarray(new.params[k]), np.asarray(params[k] - 0.1 * grads[k]), atol=1e-6
        )
    assert set(metrics) == {"loss", "accuracy", "grad_norm"}
    with pytest.raises(ConfigError, match="chunks=0"):
        contrastive.cached_gradient_step(embed, _objective, tx, chunks=0)
