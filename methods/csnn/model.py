"""CSNN (Cooperative Sheaf Neural Network) and its GCN / SAGE / NSD-style baselines as pure
functions on param pytrees.

    cfg = ModelConfig(kind="csnn", in_features=10, out_features=1, hidden=16, stalk=3)
    params = init(cfg, key)
    logits_NO = apply(cfg, params, (x_NF, edges), rng=key, train=True)   # graph_ops.Edges
    loss = binary_loss(cfg, params, (x_NF, edges), y_N, mask_N, rng=key)

CSNN (as the official model.py): lin1 in -> C d, GELU, reshape x_NDC; L layers of
    (T, cT) = conformal_maps(phi_T(vec x)), (S, cS) = conformal_maps(phi_S(vec x))
    Z = B(A(W_L X W_R))           (A only when single_operator)
    x <- (1 + tanh eps) x - GELU(dropout(Z))      [optional LayerNorm over d C]
then a linear readout from the flattened d C. `edges = graph_ops.Edges(senders_E, receivers_E)`
(both directions, sorted by receiver; see methods/csnn/data.py), optionally with `shards` for
a node set sharded over the mesh (see graph_ops).
"""

import dataclasses

import jax
import jax.numpy as jnp
import optax

from core.errors import ConfigError
from methods.csnn import graph_ops, sheaf

KINDS = ("csnn", "gcn", "sage", "nsd")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """kind: "csnn" | "gcn" | "sage" | "nsd". hidden = C channels; stalk = d (csnn and nsd).
    learner: "mlp" (dense layers on vec x_i) or "sage" (sage_layers) for CSNN's map learners,
    `learner_layers` deep and `learner_hidden` wide, GELU and dropout between layers (the
    official Minesweeper run: SAGE, 5 x 64). dropout applies at each layer's input (so to the
    map learners and the residual too, as the official CSNNConv) and to its update;
    input_dropout to the raw features. left_weights=False fixes W_L = I (the official
    Minesweeper run). layer_norm: LayerNorm after every layer, for every kind.
    CSNN ablations: source_equals_target (one learner, S_i = T_i), conformal (False: c = 1),
    single_operator (A only, not B(A(.)))."""

    kind: str = "csnn"
    in_features: int = 10
    out_features: int = 1
    hidden: int = 16
    stalk: int = 3
    num_layers: int = 3
    dropout: float = 0.0
    input_dropout: float = 0.0
    learner: str = "mlp"
    learner_layers: int = 2
    learner_hidden: int = 64
    left_weights: bool = True
    layer_norm: bool = False
    source_equals_target: bool = False
    conformal: bool = True
    single_operator: bool = False

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ConfigError(f"ModelConfig.kind={self.kind!r}, expected one of {KINDS}")
        if self.learner not in ("mlp", "sage"):
            raise ConfigError(f"ModelConfig.learner={self.learner!r}, expected 'mlp' or 'sage'")
        for name in ("hidden", "stalk", "num_layers", "learner_layers", "learner_hidden"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"ModelConfig.{name}={value!r}, expected a positive int")
        for name in ("dropout", "input_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"ModelConfig.{name}={getattr(self, name)!r}, expected [0, 1)")

    @property
    def width(self) -> int:
        """Flattened node-state width: d C for the sheaf models, C for GCN / SAGE."""
        return self.stalk * self.hidden if self.kind in ("csnn", "nsd") else self.hidden


# --- small building blocks -------------------------------------------------------------------


def _dense(params: dict, x_NF):
    return x_NF @ params["w"] + params["b"]


def _dropout(x, rate: float, rng):
    """Inverted dropout; identity when rng is None (eval) or rate is 0."""
    if rng is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def _split(rng, num: int) -> list:
    """num independent keys, or num Nones in eval mode (rng None)."""
    return [None] * num if rng is None else list(jax.random.split(rng, num))


def _layer_norm(params: dict, x_NF, eps: float = 1e-5):
    mean_N1 = x_NF.mean(-1, keepdims=True)
    var_N1 = x_NF.var(-1, keepdims=True)
    return (x_NF - mean_N1) * jax.lax.rsqrt(var_N1 + eps) * params["scale"] + params["bias"]


def _init_layer_norm(width: int) -> dict:
    return {"scale": jnp.ones((width,), jnp.float32), "bias": jnp.zeros((width,), jnp.float32)}


def _init_mixing(key, d: int, c: int, left_weights: bool) -> dict:
    """W_L = I (d x d), W_R orthogonal (C x C), eps = 0 [d, 1]: a layer starts as x - GELU(Z).
    Without left weights W_L stays the identity and is not a parameter."""
    mixing = {
        "w_right": jax.nn.initializers.orthogonal()(key, (c, c), jnp.float32),
        "eps": jnp.zeros((d, 1), jnp.float32),
    }
    if left_weights:
        mixing["w_left"] = jnp.eye(d, dtype=jnp.float32)
    return mixing


def mix_channels(params: dict, x_NDC):
    """X_i <- W_L X_i W_R, no bias: the layer's channel (and, with left weights, stalk) mixing."""
    x_NDC = x_NDC @ params["w_right"]
    if "w_left" not in params:
        return x_NDC
    return jnp.einsum("ij,njc->nic", params["w_left"], x_NDC)


def _residual_update(cfg, params: dict, x_NDC, z_NDC, rng):
    """x <- (1 + tanh eps) x - GELU(dropout(Z)), then the optional LayerNorm over d C."""
    x_NDC = (1.0 + jnp.tanh(params["eps"])) * x_NDC - jax.nn.gelu(_dropout(z_NDC, cfg.dropout, rng))
    if not cfg.layer_norm:
        return x_NDC
    n, d, c = x_NDC.shape
    return _layer_norm(params["ln"], x_NDC.reshape(n, d * c)).reshape(n, d, c)


# --- CSNN ------------------------------------------------------------------------------------


def _init_learner(cfg, key) -> dict:
    """{"layers": [learner_layers dense or sage layers]}: width -> hidden ... -> map params."""
    sizes = [cfg.width] + [cfg.learner_hidden] * (cfg.learner_layers - 1)
    sizes.append(sheaf.num_map_params(cfg.stalk, cfg.conformal))
    init_fn = graph_ops.init_sage if cfg.learner == "sage" else graph_ops.init_dense
    keys = jax.random.split(key, cfg.learner_layers)
    return {"layers": [init_fn(k, a, b) for k, a, b in zip(keys, sizes, sizes[1:], strict=False)]}


def _learner(cfg, params: dict, x_NF, edges, rng):
    """Raw map parameters [N, K] from vec(x_i) (MLP) or a SAGE stack; GELU and dropout
    between layers."""
    n = x_NF.shape[0]
    layers = params["layers"]
    rngs = [None] * len(layers) if rng is None else list(jax.random.split(rng, len(layers)))
    h_NH = x_NF
    for index, (layer, layer_rng) in enumerate(zip(layers, rngs, strict=True)):
        if index:
            h_NH = _dropout(jax.nn.gelu(h_NH), cfg.dropout, layer_rng)
        if cfg.learner == "sage":
            h_NH = graph_ops.sage_layer(layer, h_NH, edges, n)
        else:
            h_NH = _dense(layer, h_NH)
    return h_NH


def _init_csnn_layer(cfg, key) -> dict:
    k_t, k_s, k_mix = jax.random.split(key, 3)
    layer = {
        "phi_t": _init_learner(cfg, k_t),
        **_init_mixing(k_mix, cfg.stalk, cfg.hidden, cfg.left_weights),
    }
    if not cfg.source_equals_target:
        layer["phi_s"] = _init_learner(cfg, k_s)
    if cfg.layer_norm:
        layer["ln"] = _init_layer_norm(cfg.width)
    return layer


def csnn_maps(cfg, layer: dict, x_NDC, edges, rng=None):
    """(T_NDD, S_NDD, cT_N, cS_N) of one CSNN layer; S = T under source_equals_target."""
    n = x_NDC.shape[0]
    vec_NF = x_NDC.reshape(n, -1)
    rng_t, rng_s = _split(rng, 2)
    raw_t = _learner(cfg, layer["phi_t"], vec_NF, edges, rng_t)
    T_NDD, cT_N = sheaf.conformal_maps(raw_t, cfg.stalk, cfg.conformal)
    if cfg.source_equals_target:
        return T_NDD, T_NDD, cT_N, cT_N
    raw_s = _learner(cfg, layer["phi_s"], vec_NF, edges, rng_s)
    S_NDD, cS_N = sheaf.conformal_maps(raw_s, cfg.stalk, cfg.conformal)
    return T_NDD, S_NDD, cT_N, cS_N


def csnn_layer(cfg, layer: dict, x_NDC, edges, rng=None):
    """One CSNN layer on x_NDC [N, d, C]; edges a graph_ops.Edges."""
    rng_in, rng_maps, rng_out = _split(rng, 3)
    x_NDC = _dropout(x_NDC, cfg.dropout, rng_in)
    T_NDD, S_NDD, cT_N, cS_N = csnn_maps(cfg, layer, x_NDC, edges, rng_maps)
    mixed_NDC = mix_channels(layer, x_NDC)
    if cfg.single_operator:
        z_NDC = sheaf.operator_a(mixed_NDC, T_NDD, S_NDD, cT_N, edges)
    else:
        z_NDC = sheaf.diffusion(mixed_NDC, T_NDD, S_NDD, cT_N, cS_N, edges)
    return _residual_update(cfg, layer, x_NDC, z_NDC, rng_out)


# --- NSD-style baseline (general maps) -------------------------------------------------------


def _init_nsd_layer(cfg, key) -> dict:
    k_map, k_mix = jax.random.split(key)
    d = cfg.stalk
    layer = {
        "map": graph_ops.init_dense(k_map, 2 * cfg.width, d * d),
        **_init_mixing(k_mix, d, cfg.hidden, cfg.left_weights),
    }
    if cfg.layer_norm:
        layer["ln"] = _init_layer_norm(cfg.width)
    return layer


def nsd_maps(cfg, layer: dict, x_NDC, edges):
    """(F_src_EDD, F_dst_EDD) for edge e = (j -> i), NSD's concat learner:
    F_{i<e} = tanh(W [x_i ; x_j] + b) and F_{j<e} = tanh(W [x_j ; x_i] + b); the reverse edge
    gets the same pair swapped, as nsd_laplacian_apply needs. W [a ; b] = W_1 a + W_2 b, so
    both halves are projected per node (N rows) before the gather (E rows): per-edge maps, so
    the plain edge lists `edges.senders_E` / `edges.receivers_E`."""
    senders_E, receivers_E = edges.senders_E, edges.receivers_E
    n, d = x_NDC.shape[:2]
    vec_NF = x_NDC.reshape(n, -1)
    w_first, w_second = jnp.split(layer["map"]["w"], 2, axis=0)
    first_NK, second_NK = vec_NF @ w_first, vec_NF @ w_second
    b_K = layer["map"]["b"]

    def edge_maps(own_E, other_E):
        return jnp.tanh(first_NK[own_E] + second_NK[other_E] + b_K).reshape(-1, d, d)

    return edge_maps(senders_E, receivers_E), edge_maps(receivers_E, senders_E)


def nsd_layer(cfg, layer: dict, x_NDC, edges, rng=None):
    """NSD-style (general maps): x <- (1 + tanh eps) x - GELU(dropout(Delta W_L X W_R))."""
    rng_in, rng_out = _split(rng, 2)
    x_NDC = _dropout(x_NDC, cfg.dropout, rng_in)
    F_src_EDD, F_dst_EDD = nsd_maps(cfg, layer, x_NDC, edges)
    delta_NDC = sheaf.nsd_laplacian_apply(mix_channels(layer, x_NDC), F_src_EDD, F_dst_EDD, edges)
    return _residual_update(cfg, layer, x_NDC, delta_NDC, rng_out)


# --- whole models ----------------------------------------------------------------------------


def _init_layer(cfg, key) -> dict:
    if cfg.kind == "csnn":
        return _init_csnn_layer(cfg, key)
    if cfg.kind == "nsd":
        return _init_nsd_layer(cfg, key)
    init_fn = graph_ops.init_gcn if cfg.kind == "gcn" else graph_ops.init_sage
    layer = init_fn(key, cfg.hidden, cfg.hidden)
    if cfg.layer_norm:
        layer["ln"] = _init_layer_norm(cfg.width)
    return layer


def init(cfg: ModelConfig, key) -> dict:
    """{"lin_in": dense in -> width, "layers": [per-layer dicts], "readout": dense width -> out}."""
    k_in, k_out, *k_layers = jax.random.split(key, cfg.num_layers + 2)
    return {
        "lin_in": graph_ops.init_dense(k_in, cfg.in_features, cfg.width),
        "layers": [_init_layer(cfg, k) for k in k_layers],
        "readout": graph_ops.init_dense(k_out, cfg.width, cfg.out_features),
    }


def _apply_layer(cfg, layer, x, edges, rng):
    """x is x_NDC for the sheaf models and x_NC for GCN / SAGE, which get the same treatment:
    dropout at the input, x + GELU(dropout(layer x)), the optional LayerNorm."""
    if cfg.kind == "csnn":
        return csnn_layer(cfg, layer, x, edges, rng)
    if cfg.kind == "nsd":
        return nsd_layer(cfg, layer, x, edges, rng)
    rng_in, rng_out = _split(rng, 2)
    x = _dropout(x, cfg.dropout, rng_in)
    layer_fn = graph_ops.gcn_layer if cfg.kind == "gcn" else graph_ops.sage_layer
    h_NC = layer_fn(layer, x, edges, x.shape[0])
    x = x + jax.nn.gelu(_dropout(h_NC, cfg.dropout, rng_out))
    return _layer_norm(layer["ln"], x) if cfg.layer_norm else x


def apply(cfg: ModelConfig, params: dict, graph_arrays, *, rng=None, train: bool = False):
    """Logits [N, out_features]; graph_arrays = (x_NF, edges), edges a graph_ops.Edges.
    Dropout only when train and rng is given."""
    x_NF, edges = graph_arrays
    n = x_NF.shape[0]
    rng_input, *rngs = _split(rng if train else None, cfg.num_layers + 1)
    x_NF = _dropout(x_NF, cfg.input_dropout, rng_input)
    h = jax.nn.gelu(_dense(params["lin_in"], x_NF))
    if cfg.kind in ("csnn", "nsd"):
        h = h.reshape(n, cfg.stalk, cfg.hidden)  # as the official x.view(N d, C)
    for layer, layer_rng in zip(params["layers"], rngs, strict=True):
        h = _apply_layer(cfg, layer, h, edges, layer_rng)
    return _dense(params["readout"], h.reshape(n, -1))


def binary_loss(cfg: ModelConfig, params: dict, graph_arrays, y_N, mask_N, *, rng=None):
    """Mean sigmoid BCE over masked nodes of the single logit (out_features = 1); train mode."""
    logits_N = apply(cfg, params, graph_arrays, rng=rng, train=True)[:, 0]
    bce_N = optax.sigmoid_binary_cross_entropy(logits_N, y_N.astype(logits_N.dtype))
    mask_N = mask_N.astype(logits_N.dtype)
    return jnp.sum(bce_N * mask_N) / jnp.maximum(jnp.sum(mask_N), 1.0)
