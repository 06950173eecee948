"""TPC's baselines: linear, bilinear, a parameter-matched MLP and an early-exit MLP.

    fit_linear(splits)                                   # sklearn (linear.py) + its F1s
    fit(config, "mlp", splits, workdir, epochs=40)      # through core.train
    H = mlp_hidden(P, D);  H_E = ee_mlp_hidden(D, N, R)  # the parameter matching

- linear: the sklearn probe that initialises TPC's order 1 (`linear.fit`).
- bilinear: the symmetric rank-R order-2 term plus a trainable bias, nothing else: one
  `poly_probe.op` block with w1 held at 0, logit = b + sum_r lam_r (x . u_r)^2.
- mlp: D -> H (ReLU) -> 1 with H = round((P - 1) / (D + 2)), P a TPC truncation's parameter
  count (an MLP of width H has H (D + 2) + 1 parameters).
- ee_mlp: exit 1 is a linear layer on x (D + 1 parameters, as TPC's order 1); block j maps
  h_{j-1} -> h_j (ReLU, h_0 = D) and exit j + 1 is linear on h_j. Widths are solved one by one
  so that the cumulative parameters up to exit n (blocks and every exit before, all paid for on
  the way) track TPC's at order n: each block is off by less than one hidden unit's cost. It is
  trained on the mean BCE over all exits (the released code's "train_all").
Dropout (`config.model.dropout`, the released code's `d_prob`) is torch's `nn.Dropout` after each
hidden ReLU of the MLP and the EE-MLP's blocks: inverted (kept units scaled by 1 / (1 - p)),
training only. The bilinear probe has none (the released code sweeps it with p = 0 only).
Weights use torch's `nn.Linear` default (uniform +-1/sqrt(fan_in), biases too); U and lam as TPC.
Every model returns logits [B, E] (E exits; 1 but for the EE-MLP); the loss is their mean BCE.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from core import data
from core import train as core_train
from core.errors import ConfigError
from core.kernels import poly_probe
from core.method import Method
from methods.tpc import linear, model

KINDS = ("bilinear", "mlp", "ee_mlp")


def mlp_hidden(P: int, D: int) -> int:
    return max(1, round((P - 1) / (D + 2)))


def mlp_params(D: int, H: int) -> int:
    return H * (D + 2) + 1


def ee_mlp_hidden(D: int, N: int, R: int) -> list[int]:
    """[N - 1] widths whose cumulative parameters follow `model.param_counts(D, N, R)`."""
    target_N = model.param_counts(D, N, R)
    hidden, spent, width = [], D + 1, D
    for n in range(1, N):
        h = max(1, round((int(target_N[n]) - spent - 1) / (width + 2)))
        spent += h * (width + 2) + 1
        hidden.append(h)
        width = h
    return hidden


def ee_mlp_params(D: int, hidden) -> np.ndarray:
    """[len(hidden) + 1] cumulative parameters up to each exit."""
    counts, width = [D + 1], D
    for h in hidden:
        counts.append(counts[-1] + h * (width + 2) + 1)
        width = h
    return np.array(counts)


def _dense(rng, fan_in: int, fan_out: int) -> dict:
    w_rng, b_rng = jax.random.split(rng)
    bound = 1.0 / math.sqrt(fan_in)
    return {
        "w": jax.random.uniform(w_rng, (fan_in, fan_out), jnp.float32, -bound, bound),
        "b": jax.random.uniform(b_rng, (fan_out,), jnp.float32, -bound, bound),
    }


def init(kind: str, D: int, rng, *, rank: int = 16, hidden=64) -> dict:
    """Parameters of `kind`; `hidden` is H (mlp) or the widths (ee_mlp)."""
    if kind == "bilinear":
        p = model.init_params(D, 2, rank, rng)
        return {"b": p["w0"], "U": p["U"], "lam": p["lam"]}
    if kind == "mlp":
        r1, r2 = jax.random.split(rng)
        return {"hidden": _dense(r1, D, hidden), "out": _dense(r2, hidden, 1)}
    if kind == "ee_mlp":
        rngs = jax.random.split(rng, 2 * len(hidden) + 1)
        widths = [D, *hidden]
        blocks = [_dense(rngs[2 * j + 1], widths[j], h) for j, h in enumerate(hidden)]
        exits = [_dense(rngs[2 * j], widths[j], 1) for j in range(len(widths))]
        return {"blocks": blocks, "exits": exits}
    raise ConfigError(f"baseline kind={kind!r} is unknown; expected one of: {KINDS}")


def _dropout(h, p: float, rng):
    if rng is None or p == 0:
        return h
    return jnp.where(jax.random.bernoulli(rng, 1.0 - p, h.shape), h / (1.0 - p), 0.0)


def apply(kind: str, params: dict, x_BD, *, impl: str = "auto", dropout=0.0, rng=None):
    """logits [B, E]; with `rng` (training) hidden units are dropped with probability
    `dropout`."""
    if kind == "bilinear":
        zero_D = jnp.zeros(x_BD.shape[1], jnp.float32)
        Y = poly_probe.op(x_BD, params["b"], zero_D, params["U"], params["lam"], impl=impl)
        return Y[:, 1:]  # b + the order-2 term (column 0 is b alone)
    if kind == "mlp":
        h = jax.nn.relu(x_BD @ params["hidden"]["w"] + params["hidden"]["b"])
        h = _dropout(h, dropout, rng)
        return h @ params["out"]["w"] + params["out"]["b"]
    outs, h = [], x_BD
    for j, exit_ in enumerate(params["exits"]):
        if j:
            block = params["blocks"][j - 1]
            h = jax.nn.relu(h @ block["w"] + block["b"])
            h = _dropout(h, dropout, None if rng is None else jax.random.fold_in(rng, j))
        outs.append(h @ exit_["w"] + exit_["b"])
    return jnp.concatenate(outs, axis=1)


def loss_fn(kind, impl, dropout, params, batch, *, rng, extra):
    del extra
    logit_BE = apply(kind, params, batch["x"], impl=impl, dropout=dropout, rng=rng)
    y_B1 = batch["y"].astype(jnp.float32)[:, None]
    loss = jnp.mean(optax.sigmoid_binary_cross_entropy(logit_BE, y_B1))  # mean over exits too
    return loss, {"acc": jnp.mean((logit_BE[:, -1] > 0) == (y_B1[:, 0] > 0.5))}


def f1_per_exit(y_B, logit_BE) -> list[float]:
    return [model.f1_score(y_B, logit_BE[:, e]) for e in range(logit_BE.shape[1])]


def make(config, kind: str, splits, *, hidden=None) -> Method:
    """A Method training baseline `kind` on `splits` with `config`'s optimiser and batch;
    `hidden` defaults to the match of TPC's full order N at `config.model`'s rank."""
    D = splits.x_train.shape[1]
    N, R, impl = config.model.order, config.model.rank, config.model.impl
    if hidden is None and kind == "mlp":
        hidden = mlp_hidden(int(model.param_counts(D, N, R)[-1]), D)
    elif hidden is None and kind == "ee_mlp":
        hidden = ee_mlp_hidden(D, N, R)
    forward = jax.jit(functools.partial(apply, kind, impl=impl))

    def init_fn(rng, batch_spec):
        del batch_spec
        return {"params": init(kind, D, rng, rank=R, hidden=hidden)}

    def dataset(split, *, shard, seed):
        del split
        arrays = {"x": splits.x_train, "y": splits.y_train}
        return data.in_memory(arrays, global_batch=config.train.batch_size, seed=seed, shard=shard)

    def evaluate(state, *, seed):
        del seed
        val = f1_per_exit(splits.y_val, np.asarray(forward(state.params, splits.x_val)))
        test = f1_per_exit(splits.y_test, np.asarray(forward(state.params, splits.x_test)))
        return {
            **{f"val_f1_e{e + 1}": v for e, v in enumerate(val)},
            **{f"test_f1_e{e + 1}": v for e, v in enumerate(test)},
        }

    loss = functools.partial(loss_fn, kind, impl, float(config.model.dropout))
    return Method(init=init_fn, loss=loss, dataset=dataset, evaluate=evaluate)


class BaselineFit(NamedTuple):
    params: dict
    val_f1: list  # per exit
    test_f1: list
    history: list


def fit(config, kind, splits, workdir: str, *, epochs=None, hidden=None, devices=None):
    """Train `kind` for `epochs` passes (else `config.train.steps` steps) through core.train."""
    c = config.copy_and_resolve_references()
    if epochs is not None:
        c.train.steps = epochs * math.ceil(len(splits.y_train) / c.train.batch_size)
    c.train.eval_every, c.train.log_every = 0, max(1, c.train.steps // 4)
    result = core_train.run(c, make(c, kind, splits, hidden=hidden), workdir, devices=devices)
    params = jax.tree.map(np.asarray, result.state.params)
    forward = functools.partial(apply, kind, impl=c.model.impl)
    val = f1_per_exit(splits.y_val, np.asarray(forward(params, splits.x_val)))
    test = f1_per_exit(splits.y_test, np.asarray(forward(params, splits.x_test)))
    return BaselineFit(params, val, test, result.history)


def fit_linear(splits, **kw) -> BaselineFit:
    probe = linear.fit(splits.x_train, splits.y_train, splits.x_val, splits.y_val, **kw)
    logit = lambda x: (np.asarray(x, np.float32) @ probe.w1 + probe.w0)[:, None]
    val = f1_per_exit(splits.y_val, logit(splits.x_val))
    test = f1_per_exit(splits.y_test, logit(splits.x_test))
    return BaselineFit({"w0": probe.w0, "w1": probe.w1, "C": probe.C}, val, test, [])
