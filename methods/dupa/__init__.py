"""DUPA (paper 10): dual-path condition alignment for a DDT, and the arms it is compared with.

`make(config) -> core.Method`; the pure functions below are usable on their own. The arm is a
config option (`configs/dupa.py:arm=...`, its ARMS table), each a setting of `config.dupa`:

    ddt       one (t, eps) per image, batch B
    ddt_2b    one (t, eps) per image, batch 2B (the reviewers' equal-compute control)
    dual      K = 2 (t, eps) per image (a 2B forward), no alignment (lambda = 0)
    dupa      K = 2 and lambda = 0.5: the paths' conditions aligned, token-wise (see Loss)
    dupa_sg   dupa with a stop-gradient on path 0
    repa      one path, lambda = 0.5 toward the frozen digits classifier's 4x4x64 feature map
              (`core.digits`, "spatial": one 64-vector per 2x2 patch, the model's token grid)

Loss: mean over every row of the stacked batch of |v - (x - eps)|^2 (per pixel), plus lambda
times the alignment at `dupa.align_block` of the encoder (ALIGN_OPTIONS, `align.py`): the first
two studies' -cos of projected tokens of the training forward (align_head "projector",
align_label "shared", align_loss "cosine"), or the re-test's InfoNCE between the paths' own
tokens centred on the batch, no projector, from a second encoder pass with the null label
("centred", "null", "infonce"; README, "Re-test (issue 47)"). Labels are dropped to the null class
with probability `dupa.label_dropout` (CFG), the same drop for all K paths of an image. The
step keeps an EMA of the parameters (`core.steps.with_ema`, with warm-up) in
`state.extra["ema"]`; evaluation samples from the EMA weights.

Evaluation (`evaluate`, when `eval.num_samples > 0`): Euler sampling with CFG from the EMA
params (fixed noise and labels: every arm and checkpoint sees the same draws), FD-digits and
conditional accuracy against the real split `eval.split`, and a linear probe of the
mean-pooled tokens at the alignment block at t = 0.5 (null label, fixed noise), logistic
regression fit on the train split, accuracy on `eval.split` (`evaluation.py`).
"""

import functools

import jax
import jax.numpy as jnp

from core import data, digits, optim, steps
from core.errors import ConfigError
from core.method import Method
from core.nn import dit, dit_config
from core.precision import compute_dtype
from methods.dupa import align, evaluation

TARGETS = ("none", "paths", "classifier")


def model_config(config) -> dit.DiTConfig:
    return dit_config.from_fields(
        config.model,
        image_size=8,
        channels=1,
        num_classes=digits.NUM_CLASSES,
        dtype=compute_dtype(config.dtype),
    )


def align_name(config) -> str:
    k, blocks = config.dupa.align_block, config.model.encoder_blocks
    if not 0 <= k < blocks:
        raise ConfigError(f"dupa.align_block={k} must be in [0, model.encoder_blocks={blocks})")
    return f"encoder/blocks/{k}"


# The alignment's options (config.dupa): name -> (the choices, the first two studies' setting,
# which configs written before the option existed mean: collapse_check reads their run folders).
ALIGN_OPTIONS = {
    "align_head": (align.HEADS, "projector"),  # the tokens the loss compares (align.py)
    "align_label": (("shared", "null"), "shared"),  # the label of the pass they come from
    "align_loss": (("cosine", "infonce"), "cosine"),  # align.dual_path_alignment / _infonce
}


def align_option(config, name: str) -> str:
    """config.dupa.<name> of ALIGN_OPTIONS (its first-studies default when absent), checked."""
    choices, default = ALIGN_OPTIONS[name]
    value = config.dupa.get(name, default)
    if value not in choices:
        raise ConfigError(f"dupa.{name}={value!r}; expected one of: {', '.join(choices)}")
    return value


def check(config) -> None:
    d = config.dupa
    if d.target not in TARGETS:
        raise ConfigError(f"dupa.target={d.target!r}; expected one of: {', '.join(TARGETS)}")
    if d.paths < 1 or (d.target == "paths" and d.align_weight and d.paths < 2):
        raise ConfigError(f"dupa.paths={d.paths}: dual-path alignment needs >= 2 paths")
    if d.target == "classifier" and d.paths != 1:
        raise ConfigError(f"dupa.target='classifier' (REPA) uses one path, got paths={d.paths}")
    options = {name: align_option(config, name) for name in ALIGN_OPTIONS}
    if d.target == "classifier" and options != {n: v[1] for n, v in ALIGN_OPTIONS.items()}:
        raise ConfigError(
            f"dupa.target='classifier' (REPA) has its projector and cosine: {options}"
        )
    if options["align_loss"] == "infonce" and d.stop_gradient:
        raise ConfigError("dupa.align_loss='infonce' has no stop-gradient variant")
    if not 0 <= d.label_dropout < 1:
        raise ConfigError(f"dupa.label_dropout={d.label_dropout} must be in [0, 1)")


def init(cfg, settings, target_params, rng, batch_spec):
    """Network (+ projector) params; the EMA copy; the frozen target encoder (REPA) as extra.
    The network's init is the same under every head: a seed pairs the arms."""
    del batch_spec
    k_net, k_proj = jax.random.split(rng)
    params = {"net": dit.init_params(cfg, k_net)}
    if settings.align_head == "projector":
        out_dim = settings.projector_dim
        if target_params is not None:
            out_dim = target_params["conv2"]["w"].shape[-1]
        gain = settings.projector_gain
        params["projector"] = align.init_projector(k_proj, cfg.d_model, out_dim, gain)
    out = {"params": params, "ema": jax.tree.map(jnp.copy, params)}
    if target_params is not None:
        out["target_encoder"] = target_params  # host arrays: placed, not compiled in
    return out


def loss_fn(cfg, settings, params, batch, *, rng, extra):
    """Velocity MSE over all K * B rows + align_weight * the arm's alignment loss."""
    x_BHWC, y_B = batch["image"], batch["label"]
    k_drop, k_paths = jax.random.split(rng)
    y_B = dit.drop_labels(cfg, k_drop, y_B, settings.label_dropout)
    aligns = settings.target != "none" and settings.align_weight > 0
    out = align.paths_forward(
        cfg,
        params["net"],
        x_BHWC,
        y_B,
        k_paths,
        paths=settings.paths,
        align_at=settings.align_at if aligns else None,
        align_label=dit.null_label(cfg) if settings.align_null_label else None,
    )
    velocity = jnp.mean((out.velocity_KBHWC - out.target_KBHWC) ** 2)
    metrics = {"velocity_loss": velocity}
    if not aligns:
        return velocity, metrics
    features_KBND = out.features_KBND.astype(jnp.float32)
    z_KBNP = align.aligned_tokens(settings.align_head, params, features_KBND)
    if settings.target == "paths":
        if settings.align_loss == "infonce":
            alignment = align.dual_path_infonce(z_KBNP, settings.align_temperature)
        else:
            alignment = align.dual_path_alignment(z_KBNP, stop_gradient=settings.stop_gradient)
    else:
        feats = digits.forward(extra["target_encoder"], x_BHWC)["spatial"]
        target_BNP = feats.reshape(feats.shape[0], -1, feats.shape[-1])  # row-major = patchify
        alignment = align.encoder_alignment(z_KBNP[0], target_BNP)
    metrics["align_loss"] = alignment
    return velocity + settings.align_weight * alignment, metrics


def eval_step(cfg, state, batch, *, rng):
    """Held-out velocity MSE of the EMA weights (one path, no label dropout)."""
    out = align.paths_forward(
        cfg, state.extra["ema"]["net"], batch["image"], batch["label"], rng, paths=1
    )
    err_B = jnp.mean((out.velocity_KBHWC[0] - out.target_KBHWC[0]) ** 2, axis=(1, 2, 3))
    mask = batch["mask"].astype(jnp.float32)
    return {"velocity_loss": (jnp.sum(err_B * mask), jnp.sum(mask))}


class Settings:
    """The loss's static settings, read once from config.dupa."""

    def __init__(self, config):
        check(config)
        d = config.dupa
        self.paths, self.align_weight = d.paths, d.align_weight
        self.stop_gradient, self.target = d.stop_gradient, d.target
        self.label_dropout = d.label_dropout
        self.align_head = align_option(config, "align_head")
        self.align_null_label = align_option(config, "align_label") == "null"
        self.align_loss = align_option(config, "align_loss")
        self.align_temperature = d.get("align_temperature", 0.2)  # read by infonce only
        self.projector_dim, self.projector_gain = d.projector_dim, d.projector_gain
        self.align_at = align_name(config)


def make(config) -> Method:
    cfg = model_config(config)
    settings = Settings(config)
    splits = digits.load_splits()
    needs_classifier = settings.target == "classifier" or config.eval.num_samples > 0
    clf = digits.classifier(config.eval.classifier_cache) if needs_classifier else None
    target_params = clf.params if settings.target == "classifier" else None
    tx = optim.make(config.optim, config.train.steps)
    loss = functools.partial(loss_fn, cfg, settings)
    step = steps.with_ema(
        steps.gradient_step(loss, tx), config.dupa.ema_decay, warmup=config.dupa.ema_warmup
    )
    eval_split = evaluation.split_of(splits, config.eval.split)

    def dataset(which, *, shard, seed):
        if which == "eval":
            arrays = {"image": eval_split.images, "label": eval_split.labels}
            return data.one_pass(arrays, global_batch=config.train.batch_size, shard=shard)
        arrays = {"image": splits.train.images, "label": splits.train.labels}
        return data.in_memory(arrays, global_batch=config.train.batch_size, seed=seed, shard=shard)

    evaluate = None
    if config.eval.num_samples > 0:
        evaluator = evaluation.Evaluator(cfg, config.eval, clf, splits, align_name(config))
        evaluate = lambda state, *, seed: evaluator(state.extra["ema"]["net"])  # noqa: E731

    return Method(
        init=functools.partial(init, cfg, settings, target_params),
        step=step,
        tx=tx,
        dataset=dataset,
        eval_step=functools.partial(eval_step, cfg),
        evaluate=evaluate,
    )
