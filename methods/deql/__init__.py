"""DEQL (paper 8 of PAPERS.md): linear-autoencoder recommenders in closed form.

- `data.py`: MovieLens-100k (the recbole wheel's ml-100k.inter, or GroupLens u.data), binarised
  at rating >= 4, as scipy CSR user x item matrices; seeded strong- (held-out users, 80 %
  fold-in) and weak-generalisation splits.
- `solvers.py`: the Gram matrix (one device, or users sharded over a mesh with a psum); EASE,
  EDLAE (b = 0) and DEQL (b > 0; plain, L2, L2 + zero diagonal) by the vectorised Miller /
  Sherman-Morrison algorithm, its O(n^4) direct oracle, and the analytic expected loss.
- `metrics.py`: Recall@k (normalised by min(k, #held-out)) and NDCG@k with fold-in items masked.
- `experiment.py`: EASE / EDLAE / DEQL(plain) / DEQL(L2) on ML-100k over seeded user splits.
- here: `make(config) -> Method` for `core.train`. The dataset is the split's train matrix as
  one global batch (users padded with zero rows to `train.batch_size`); `step` is one
  closed-form fit: the Gram matrix of the batch (under a multi-device mesh, users sharded and
  summed with a psum inside `shard_map`), then `fit` in float64; W lives in the state as
  float32 (ranking only). No loss and no optimiser: `state.opt_state` is empty. `eval_step`
  gives validation Recall@20/50 and NDCG@100 on the mesh (users sharded, W as trained, e.g.
  FSDP-sharded over several processes), over `dataset("eval")`: the validation users' fold-in
  and held-out rows in one padded pass.

    python -m launch.train --config=configs/deql.py:model=deql --workdir=/tmp/deql
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse as sp

from core import data as core_data
from core import precision
from core.errors import ConfigError
from core.mesh import data_axes
from core.method import Method
from methods.deql import data, metrics, solvers

MODELS = ("ease", "edlae", "deql")
EVAL_KS = (("recall", 20), ("recall", 50), ("ndcg", 100))


class Hyper(NamedTuple):
    """One closed-form model: ease (lam), edlae (p, lam), deql (a, b, p, lam, zero_diag)."""

    model: str = "deql"
    a: float = 1.0
    b: float = 0.5
    p: float = 0.5
    lam: float = 100.0
    zero_diag: bool = False


def check(hp: Hyper) -> Hyper:
    """`hp`, or a ConfigError naming the bad field (the checks `solvers` makes, made early)."""
    if hp.model not in MODELS:
        raise ConfigError(f"model={hp.model!r} is unknown; expected one of: {', '.join(MODELS)}")
    if not 0 <= hp.p < 1:
        raise ConfigError(f"p={hp.p}: the dropout probability must be in [0, 1)")
    if hp.lam < 0:
        raise ConfigError(f"lam={hp.lam}: the L2 weight must be >= 0")
    if hp.model == "deql" and hp.b == 0 and hp.lam == 0:
        raise ConfigError("b=0 with lam=0 makes every H^(i) singular; use model=edlae for b = 0")
    return hp


def fit(K_II, hp: Hyper, factor64: bool = False) -> jax.Array:
    """W [I, I] float64 of model `hp` from the Gram matrix; traceable (call under
    `jax.enable_x64(True)` with a float64 K) and jit-compiled once per model and zero_diag.
    `factor64`: the float64 Cholesky without refinement, for one device (`solvers._spd_inverse`)."""
    if hp.model == "deql":
        return solvers.deql_traced(K_II, hp.a, hp.b, hp.p, hp.lam, hp.zero_diag, factor64)
    return solvers.edlae_traced(K_II, hp.p if hp.model == "edlae" else 0.0, hp.lam, factor64)


def fit_host(K_II, hp: Hyper) -> np.ndarray:
    """`fit` outside any trace, on the default device: numpy float64 in, numpy float64 out
    (a float64 Cholesky: one device, so no multi-chip limit applies)."""
    check(hp)
    with jax.enable_x64(True):
        return np.asarray(fit(jnp.asarray(np.asarray(K_II, np.float64)), hp, factor64=True))


def mesh_gram(X_UI) -> jax.Array:
    """K = X^T X [I, I] while tracing: with a multi-device mesh in context (`core.train` traces
    the step with it), each device forms its rows' Gram matrix and a psum over the batch axes
    adds them, so only one [I, I] block per device is ever formed; else one matmul."""
    mesh = jax.sharding.get_abstract_mesh()
    axes = () if mesh.empty else data_axes(mesh)
    if not axes or np.prod([mesh.shape[a] for a in axes]) == 1:
        return X_UI.T @ X_UI
    return solvers.psum_gram(X_UI, mesh, axes)


def reconstruction_error(K_II, W_II) -> jax.Array:
    """||X - X W||_F^2 / ||X||_F^2 from K = X^T X (no dropout): the step's "loss" metric."""
    trace_K = jnp.trace(K_II)
    return (trace_K - 2 * jnp.sum(K_II * W_II) + jnp.sum(W_II * (K_II @ W_II))) / trace_K


def init(rng, batch_spec) -> dict:
    del rng
    n_items = batch_spec["x"].shape[-1]
    return {"params": {"W": jnp.zeros((n_items, n_items), jnp.float32)}}


def step(state, batch, *, rng, hp: Hyper):
    """One closed-form fit: W from the Gram matrix of the batch (float32 counts are exact below
    2^24 per item pair), solved in float64, stored as float32."""
    del rng
    K_II = mesh_gram(batch["x"])
    with jax.enable_x64(True):
        K64_II = K_II.astype(jnp.float64)
        W64_II = fit(K64_II, hp)
        err = reconstruction_error(K64_II, W64_II)
        W_II = W64_II.astype(state.params["W"].dtype)
        err = err.astype(jnp.float32)
    return state.replace(params={"W": W_II}), {"loss": err}


def eval_pairs(split) -> tuple:
    """(fold-in, held-out) of the validation users: held-out users' 80/20 (strong), or every
    user's train interactions and validation items (weak)."""
    if isinstance(split, data.StrongSplit):
        return split.val_in, split.val_out
    return split.train, split.val


def evaluate_W(W_II, fold_in, held_out) -> dict:
    """Recall@20, Recall@50, NDCG@100 (k capped at the item count)."""
    out = {}
    for name, k in EVAL_KS:
        k_used = min(k, W_II.shape[0])
        out[f"{name}@{k}"] = metrics.evaluate(W_II, fold_in, held_out, k=k_used)[name]
    return out


def evaluate_users(W_II, fold_in, held_out) -> dict:
    """`evaluate_W`'s metrics per user: {"recall@20": [U] float64, ...}, nan for a user without
    held-out items (the means leave them out)."""
    out = {}
    for name, k in EVAL_KS:
        k_used = min(k, W_II.shape[0])
        out[f"{name}@{k}"] = metrics.per_user(W_II, fold_in, held_out, k=k_used)[name]
    return out


def load_split(cfg):
    """The split `cfg` (config.data) names, of ML-100k or of a synthetic matrix."""
    if cfg.source == "ml100k":
        X = data.load_ml100k().matrix
    elif cfg.source == "synthetic":
        X = synthetic_interactions(cfg.n_users, cfg.n_items, seed=cfg.seed)
    else:
        raise ConfigError(f"data.source={cfg.source!r} is unknown; expected ml100k or synthetic")
    if cfg.split == "strong":
        return data.strong_split(X, n_val=cfg.n_val, n_test=cfg.n_test, seed=cfg.seed)
    if cfg.split == "weak":
        return data.weak_split(X, seed=cfg.seed)
    raise ConfigError(f"data.split={cfg.split!r} is unknown; expected strong or weak")


def synthetic_interactions(users: int, items: int, seed: int, rank: int = 4) -> sp.csr_matrix:
    """0/1 interactions with low-rank structure (users pick items of their taste groups), every
    item and user with at least two interactions: a tiny stand-in for ML-100k."""
    rng = np.random.default_rng(seed)
    taste_UR = rng.dirichlet(np.full(rank, 0.3), size=users)
    items_RI = rng.dirichlet(np.full(items, 0.5), size=rank)
    prob_UI = np.minimum(1.0, taste_UR @ items_RI * items * 0.15)
    X = (rng.random((users, items)) < prob_UI).astype(np.float32)
    X[np.arange(users), rng.integers(items, size=users)] = 1
    X[np.arange(users), rng.integers(items, size=users)] = 1
    X[rng.integers(users, size=items), np.arange(items)] = 1
    return sp.csr_matrix(X)


def eval_step(state, batch, *, rng, n_items: int):
    """Per-metric (sum over valid users, count of valid users) for one batch of validation
    users; the core adds them up over batches, devices and processes. A user is valid when
    real (not padding) and with held-out items, as in `metrics.evaluate`."""
    del rng
    x_BI, y_BI = batch["fold_in"], batch["held_out"]
    scores_BI = x_BI @ state.params["W"]
    valid_B = batch["mask"] & jnp.any(y_BI > 0, axis=1)
    count = jnp.sum(valid_B.astype(jnp.float32))
    out = {}
    for k in sorted({min(k, n_items) for _, k in EVAL_KS}):
        per_user = metrics.topk_metrics(scores_BI, x_BI, y_BI, k)
        for name, k_asked in EVAL_KS:
            if min(k_asked, n_items) == k:
                out[f"{name}@{k_asked}"] = (jnp.sum(jnp.where(valid_B, per_user[name], 0)), count)
    return out


def dataset(split_name, *, shard, seed, X_UI, eval_pairs, batch_size: int):
    """ "train": the train matrix as one global batch at every step (users padded with zero
    rows, which add nothing to K, up to `batch_size`): `core.data.in_memory`, full batch, no
    shuffle. "eval": the validation users' fold-in and held-out rows, one padded pass."""
    if split_name == "eval":
        fold_in, held_out = (np.asarray(M.toarray(), np.float32) for M in eval_pairs)
        arrays = {"fold_in": fold_in, "held_out": held_out}
        return core_data.one_pass(arrays, global_batch=batch_size, shard=shard)
    if X_UI.shape[0] > batch_size:
        raise ConfigError(
            f"train.batch_size={batch_size} is below the {X_UI.shape[0]} train users; the fit "
            f"takes all of them in one batch: set train.batch_size >= {X_UI.shape[0]}"
        )
    x_UI = np.zeros((batch_size, X_UI.shape[1]), np.float32)
    x_UI[: X_UI.shape[0]] = X_UI.toarray()
    return core_data.in_memory(
        {"x": x_UI}, global_batch=batch_size, seed=seed, shard=shard, shuffle=False
    )


def make(config) -> Method:
    precision.compute_dtype(
        config.dtype,
        ("float32",),
        "its closed-form solves factorise an item-item Gram matrix: float32 or better",
    )
    hp = check(Hyper(**config.model.to_dict()))
    split = load_split(config.data)
    X_UI = split.train
    return Method(
        init=init,
        step=functools.partial(step, hp=hp),
        dataset=functools.partial(
            dataset, X_UI=X_UI, eval_pairs=eval_pairs(split), batch_size=config.train.batch_size
        ),
        eval_step=functools.partial(eval_step, n_items=X_UI.shape[1]),
    )
