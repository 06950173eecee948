"""Brain-Semantoks (paper 7): network tokens of brain dynamics, self-distilled across time.

    python -m launch.train --config=configs/brain_semantoks.py --workdir=/tmp/bs
    python -m launch.reproduce --methods=brain_semantoks

- `data.py`: the synthetic fMRI generator (VAR(1) network latents, two phenotypes, a shifted
  site), FC features.
- `model.py`: the tokenizer (per-network dense + SGConv branches, or ROI tokens), the encoder,
  the projection head, as pure functions of a params dict.
- `losses.py`: L_CLS (SimDINO's coding rate), L_TTR and its schedule, L_Tok with slice masks,
  the views, the teacher momentum.
- `probe.py`: test-time-crop features, the linear probe, the FC baseline, collapse diagnostics.
- `experiment.py`: the arms and claims (`launch.reproduce`).

`make(config)` returns a `core.Method`: the loss of one step on two augmented crops of every
scan in the batch (student on both, masked on `ssl.masking_frequency` of the steps; teacher on
the unmasked crops), the core's gradient step under AdamW with a cosine weight decay, then the
teacher's EMA update with a cosine momentum (`core.steps.with_ema`), the TTR weight a function
of the step (`core.steps.with_schedules`). Two named evaluators: "probe" (linear probes of the
teacher's features, at the end) and "collapse" (diagnostics, every `train.eval_every` steps).
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp

from core import data as core_data
from core import optim
from core.errors import ConfigError
from core.method import Evaluator, Method
from core.precision import compute_dtype
from core.steps import gradient_step, with_ema, with_schedules
from methods.brain_semantoks import data, losses, model, probe

VIEWS = 2
# The FC baseline's inverse L2 strengths: as many as the probe's learning rates (the same budget).
FC_GRID = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def model_config(config) -> model.ModelConfig:
    dtype = compute_dtype(config.dtype)
    fields = {f.name for f in dataclasses.fields(model.ModelConfig)} - {"dtype"}
    unknown = set(config.model) - fields
    if unknown:
        raise ConfigError(f"brain_semantoks: unknown model fields {sorted(unknown)}")
    return model.ModelConfig(**config.model.to_dict(), dtype=jnp.dtype(dtype).name)


def site(config) -> data.Site:
    return data.Site(
        rois=config.model.rois,
        networks=config.model.networks,
        snr=config.data.snr,
        length=config.data.length,
    )


@functools.lru_cache(maxsize=4)
def _cohort(s: data.Site, n: int, seed: int) -> data.Cohort:
    return data.cohort(s, n, seed)


# Disjoint generator seeds: pretraining scans (unlabelled: their labels are never read), the
# labelled probe set of the same site, the out-of-distribution site's, the collapse batch.
PRETRAIN_SEED, PROBE_SEED, OOD_SEED, COLLAPSE_SEED = 1_000, 2_000, 3_000, 4_000


def pretraining(config) -> data.Cohort:
    return _cohort(site(config), config.data.subjects, PRETRAIN_SEED + config.data.seed)


def views_and_masks(cfg: model.ModelConfig, ssl, rng, x_BCT):
    """One step's inputs from its key: the two augmented crops [V, B, C, crop] of each scan and
    the slice masks [V, B, G, P] (all False on the steps that do not mask), and that flag."""
    k_views, k_do, k_masks = jax.random.split(rng, 3)
    views_VBCT = losses.views(k_views, x_BCT, cfg.crop, VIEWS)
    V, B = views_VBCT.shape[:2]
    do_mask = jax.random.uniform(k_do) < ssl.masking_frequency
    masks = [losses.slice_masks(k, B, cfg.rows, cfg.patches, tuple(ssl.mask_ratio))
             for k in jax.random.split(k_masks, V)]  # fmt: skip
    return views_VBCT, jnp.stack(masks) & do_mask, do_mask


def ssl_loss(cfg: model.ModelConfig, ssl, params, batch, *, rng, extra):
    """L_CLS + w(step) L_TTR + mask_weight L_Tok on two crops of each scan (module docstring)."""
    views_VBCT, mask_VBGP, do_mask = views_and_masks(cfg, ssl, rng, batch["x"])
    V, B = views_VBCT.shape[:2]
    teacher, buffers = extra["teacher"], extra["buffers"]

    def encode(p, x, m):
        tokens = model.encode(cfg, p, buffers, x, m)
        return tokens, model.project(p["head"], tokens)

    t_tokens, t_z = jax.vmap(lambda x: encode(teacher, x, None))(views_VBCT)
    s_tokens, s_z = jax.vmap(lambda x, m: encode(params, x, m))(views_VBCT, mask_VBGP)
    t_z, t_tokens = jax.lax.stop_gradient((t_z, t_tokens))
    cls, comp, expa = losses.mcr_loss(s_z[:, :, 0], t_z[:, :, 0])

    def summaries(p, tokens):  # each network's patch-averaged token, through the head
        grid = tokens[:, :, 1:].reshape(V, B, cfg.rows, cfg.patches, -1).mean(3)
        return model.project(p["head"], grid).reshape(V, B * cfg.rows, -1)

    w_ttr = extra["ttr_weight"]
    ttr = jax.lax.cond(
        w_ttr > 0,
        lambda: losses.mcr_loss(summaries(params, s_tokens), summaries(teacher, t_tokens))[0],
        lambda: jnp.float32(0.0),
    )
    grid = lambda z: z[:, :, 1:].reshape(V, B, cfg.rows, cfg.patches, -1)
    tok = losses.token_loss(grid(s_z), grid(t_z), mask_VBGP)
    total = cls + w_ttr * ttr + ssl.mask_weight * tok
    metrics = {
        "cls_loss": cls,
        "compression": comp,
        "expansion": expa,
        "ttr_loss": ttr,
        "token_loss": tok,
        "masked": do_mask.astype(jnp.float32),
        "teacher_proj_std": t_z[0, :, 0].std(0).mean(),
    }
    return total, metrics


def _check(config) -> None:
    ssl = config.ssl
    if not 0.0 <= ssl.ttr_fraction <= 1.0:
        raise ConfigError(f"ssl.ttr_fraction={ssl.ttr_fraction!r} must be a fraction in [0, 1]")
    if not 0.0 <= ssl.masking_frequency <= 1.0:
        raise ConfigError(f"ssl.masking_frequency={ssl.masking_frequency!r} must be in [0, 1]")
    lo, hi = ssl.mask_ratio
    if not 0.0 < lo <= hi < 1.0:
        raise ConfigError(f"ssl.mask_ratio={tuple(ssl.mask_ratio)} must be 0 < low <= high < 1")
    if config.data.subjects < config.train.batch_size:
        raise ConfigError(
            f"data.subjects={config.data.subjects} is fewer than train.batch_size="
            f"{config.train.batch_size}"
        )
    if config.model.crop > config.data.length:
        raise ConfigError(
            f"model.crop={config.model.crop} exceeds a scan's data.length={config.data.length}"
        )


def evaluators(config, cfg: model.ModelConfig) -> tuple[Evaluator, ...]:
    p = config.probe

    def probe_eval(state, *, seed):
        del seed  # the probe's splits and initialisations are seeded by the config
        teacher, buffers = state.extra["teacher"], state.extra["buffers"]
        return evaluate_probes(config, cfg, teacher, buffers)

    def collapse_eval(state, *, seed):
        del seed
        x = _cohort(site(config), p.collapse_scans, COLLAPSE_SEED).x_NCT[:, :, : cfg.crop]
        out = probe.collapse(cfg, state.extra["teacher"], state.extra["buffers"], x)
        return {k: float(v) for k, v in out.items()}

    return (
        Evaluator("probe", evaluate=probe_eval, every=0),
        Evaluator("collapse", evaluate=collapse_eval),
    )


def probe_set(config, name: str, s: data.Site):
    """The labelled cohort of set `name` (id | ood: fixed by data.seed) and its probe splits
    (drawn per model seed, so the arms of one seed are compared on the same splits)."""
    p = config.probe
    data_seed = (PROBE_SEED if name == "id" else OOD_SEED) + config.data.seed
    split_seed = data_seed * 1000 + config.seed
    sp = probe.splits(p.subjects, p.train, p.val, p.repetitions, split_seed)
    return _cohort(s, p.subjects, data_seed), sp, split_seed


def evaluate_probes(config, cfg, params, buffers) -> dict:
    """The linear probe on both phenotypes, in distribution and on the shifted site:
    "<set>/<phenotype>/{val,test,edge_share}" (set: id | ood; phenotype: a | b)."""
    p = config.probe
    out = {}
    sets = {"id": site(config), "ood": data.ood(site(config))}
    for name, s in sets.items():
        c, sp, seed = probe_set(config, name, s)
        feats = probe.crop_features(cfg, params, buffers, c.x_NCT, p.crops)
        for phen, y, classes in (("a", c.a_N, 2), ("b", c.b_N, len(s.rho_b))):
            r = probe.linear_probe(feats, y, sp, tuple(p.lrs), classes=classes,
                                   epochs=p.epochs, seed=seed)  # fmt: skip
            out |= {f"{name}/{phen}/{k}": v for k, v in r.items()}
    return out


def make(config) -> "Method":
    cfg = model_config(config)
    _check(config)
    ssl = config.ssl
    steps = config.train.steps
    tx = optim.make(config.optim, steps)
    loss = functools.partial(ssl_loss, cfg, ssl)
    ttr = functools.partial(losses.ttr_weight, total_steps=steps, fraction=ssl.ttr_fraction,
                            weight=ssl.ttr_weight)  # fmt: skip
    momentum = functools.partial(losses.momentum, total_steps=steps, base=ssl.momentum)
    step = with_ema(
        with_schedules(gradient_step(loss, tx), {"ttr_weight": ttr}), momentum, key="teacher"
    )

    def init(rng, batch_spec):
        del batch_spec
        params, buffers = model.init(cfg, rng)
        return {"params": params, "teacher": params, "buffers": buffers}

    def dataset(split, *, shard, seed):
        del split
        return core_data.in_memory(
            {"x": pretraining(config).x_NCT},
            global_batch=config.train.batch_size,
            seed=seed,
            shard=shard,
        )

    return Method(
        init=init,
        step=step,
        tx=tx,
        dataset=dataset,
        evaluators=evaluators(config, cfg),
    )


def fc_baseline(config) -> dict:
    """The FC + logistic-regression baseline on the probe sets of `evaluate_probes`."""
    p = config.probe
    out = {}
    for name, s in {"id": site(config), "ood": data.ood(site(config))}.items():
        c, sp, _ = probe_set(config, name, s)
        feats = data.fc_features(c.x_NCT)
        cs = FC_GRID[: len(p.lrs)]
        for phen, y, classes in (("a", c.a_N, 2), ("b", c.b_N, len(s.rho_b))):
            r = probe.fc_probe(feats, y, sp, cs, classes=classes)
            out |= {f"{name}/{phen}/{k}": v for k, v in r.items()}
    return out
