"""Think-Then-Embed (paper 11 of PAPERS.md; issue 43): a reasoner writes an embedding-centric
trace, an embedder retrieves with it.

- `tasks.py`: the instruction language over digits, the six families, ECR traces.
- `examples.py`: training pairs (teacher traces from labels), SFT sequences, evaluation queries and
  their 1,000-candidate galleries, Precision@1.
- `traces.py`: test-time traces from the inputs alone (the teacher over the digits classifier's
  reading; the trained reasoner's greedy decoding).
- `embedder.py`: the VLM embedder (last non-pad token) and TTE_u's head on a frozen reasoner.
- `heads.py`: TTE_u's heads (MHSA blocks on a middle layer; an attention pooler on the last).
- here: `make(config) -> Method` for `core.train`, by `config.tte.role`:
  embedder: InfoNCE (q -> t, tau 0.02, same-target false negatives removed) by GradCache's
  cached two-pass gradient (`core.contrastive`); reasoner: next-token NLL on the teacher's
  traces; unified: the head alone on the reasoner of `config.tte.reasoner` (a scoped optimiser
  freezes the reasoner).

    python -m launch.train --config=configs/tte.py:size=quick --workdir=/tmp/tte
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np

from core import checkpoint, contrastive, data, digits, optim
from core.errors import ConfigError
from core.method import Method
from core.nn import transformer, vlm
from methods.tte import embedder, examples, heads, tasks, text, traces

VALIDATION_SEED = 1  # the validation queries; the test queries use TEST_SEED
TEST_SEED = 2


def query_format(config) -> examples.QueryFormat:
    t = config.tte
    return examples.QueryFormat(t.style, float(t.rho), bool(t.trace_only), t.families).check()


def _check(config) -> None:
    t = config.tte
    if t.role not in ("embedder", "reasoner", "unified"):
        raise ConfigError(f"tte.role={t.role!r}; one of embedder, reasoner, unified")
    if t.tau <= 0:
        raise ConfigError(f"tte.tau={t.tau}; the InfoNCE temperature must be > 0")
    chunks = t.grad_cache_chunks
    if chunks < 0 or (chunks and config.train.batch_size % chunks):
        raise ConfigError(
            f"tte.grad_cache_chunks={chunks} must be 0 (plain gradient) or divide "
            f"train.batch_size={config.train.batch_size}"
        )


def reasoner_params(workdir: str, cfg: vlm.VLMConfig):
    """The params of the reasoner run in `workdir` (its newest good checkpoint), as numpy."""
    init = functools.partial(vlm.init_params, cfg)
    return jax.tree.map(np.asarray, checkpoint.run_params(workdir, init, what="tte.reasoner"))


def _sides(batch):
    """The flat batch's query and target sides, as `core.contrastive.grad_cache` reads them."""
    return {
        "query": {"image": batch["q_image"], "tokens": batch["q_tokens"]},
        "target": {"image": batch["t_image"], "tokens": batch["t_tokens"]},
        "label": batch["label"],
    }


def _classifier(config):
    return digits.classifier(os.path.expanduser(config.tte.classifier_cache))


def validation_precision(config, embed_fn, params, split_name="validation", seed=VALIDATION_SEED):
    """{"p1/<family>", "p1/mean"} with the teacher's test-time traces (the classifier's reading,
    the config's style and rho): what `core.train` logs and what the experiment selects on."""
    fmt, n = query_format(config), config.tte.eval_queries
    s = tasks.split(split_name)
    if fmt.families == "text":
        return text_precision(embed_fn, params, s, split_name, n, seed, fmt.style)
    clf = _classifier(config) if fmt.style != "none" else None
    queries, sides = {}, {}
    for family in tasks.FAMILIES:
        q = queries[family] = examples.eval_queries(s, family, n, seed)
        perceived = traces.perceive(clf.params, q) if clf else np.full((n, 2), -1)
        words = traces.teacher(q, perceived, style=fmt.style, rho=fmt.rho, seed=seed)
        sides[family] = traces.query_sides(q, words, trace_only=fmt.trace_only)
    p = embedder.precision(embed_fn, params, queries, sides, examples.gallery(s))
    return {**{f"p1/{f}": v for f, v in p.items()}, "p1/mean": float(np.mean(list(p.values())))}


def text_precision(embed_fn, params, s, group, n, seed, style, answers_of=None) -> dict:
    """{"p1/<family>", "p1/mean"} on the text families' queries over pairs of `group`, with
    traces around `answers_of(q)` (default: the teacher's, computed from the query's digits)."""
    queries, sides = {}, {}
    for family in tasks.TEXT_FAMILIES:
        q = queries[family] = text.eval_queries(s, family, group, n, seed)
        answers = answers_of(q) if answers_of else text.answers(q)
        sides[family] = text.query_sides(q, answers, style)
    p = embedder.precision(embed_fn, params, queries, sides, examples.gallery(s))
    return {**{f"p1/{f}": v for f, v in p.items()}, "p1/mean": float(np.mean(list(p.values())))}


def sft_loss(cfg: vlm.VLMConfig, params, batch, *, rng=None, extra=None):
    """Next-token NLL on the trace and eos given [image; instruction] (the paper's L_SFT)."""
    del rng, extra
    logits_BTV = vlm.apply(cfg, params, batch["image"], batch["tokens"]).logits_BTV
    logits_BTV = logits_BTV[:, cfg.num_image_tokens :]
    logp_BT = jnp.take_along_axis(jax.nn.log_softmax(logits_BTV), batch["targets"][..., None], -1)
    mask_BT = batch["mask"]
    denom = jnp.maximum(mask_BT.sum(), 1.0)
    right_BT = jnp.argmax(logits_BTV, -1) == batch["targets"]
    return -(logp_BT[..., 0] * mask_BT).sum() / denom, {
        "accuracy": (right_BT * mask_BT).sum() / denom
    }


def trace_accuracy(config, cfg, params, split_name="validation", seed=VALIDATION_SEED) -> dict:
    """The share of greedy traces equal to the teacher's on the true digits, per family."""
    s, out = tasks.split(split_name), {}
    for family in tasks.FAMILIES:
        q = examples.eval_queries(s, family, config.tte.eval_queries, seed)
        words = traces.reasoner(cfg, params, q)
        truth = traces.teacher(q, q.shown, style="full", rho=0.0, seed=seed)
        out[f"trace_exact/{family}"] = float(
            np.mean([a == b for a, b in zip(words, truth, strict=True)])
        )
    out["trace_exact/mean"] = float(np.mean(list(out.values())))
    return out


def _reasoner(config, cfg) -> Method:
    train_split = tasks.split("train")

    def init(rng, batch_spec):
        del batch_spec
        return {"params": vlm.init_params(cfg, rng)}

    def dataset(split, *, shard, seed):
        example = functools.partial(examples.reasoner_example, s=train_split)
        return data.synthetic(example, global_batch=config.train.batch_size, seed=seed, shard=shard)

    def evaluate(state, *, seed):
        del seed
        return (
            trace_accuracy(config, cfg, jax.device_get(state.params))
            if config.tte.eval_queries
            else {}
        )

    return Method(
        init=init,
        loss=functools.partial(sft_loss, cfg),
        dataset=dataset,
        evaluate=evaluate,
        sharding_rules=transformer.SHARDING_RULES,
    )


def make(config) -> Method:
    _check(config)
    t, cfg = config.tte, embedder.model_config(config)
    if t.role == "reasoner":
        return _reasoner(config, cfg)
    fmt = query_format(config)
    train_split = tasks.split("train")
    tx = optim.make(config.optim, config.train.steps)
    if t.role == "unified":
        head_cfg = embedder.head_config(config)
        heads.check(head_cfg, cfg.decoder)
        frozen = reasoner_params(t.reasoner, cfg)
        embed_fn = functools.partial(embedder.unified_embed, cfg, head_cfg)
        tx = optim.scoped([(r"^reasoner/", None), (r"^head/", "head")], {"head": tx})

        def init(rng, batch_spec):
            del batch_spec
            head = heads.init_head(head_cfg, cfg.decoder, frozen["decoder"], rng)
            return {"params": {"reasoner": frozen, "head": head}}
    else:
        embed_fn = functools.partial(embedder.embed, cfg)

        def init(rng, batch_spec):
            del batch_spec
            return {"params": vlm.init_params(cfg, rng)}

    def objective(e, batch):
        return contrastive.info_nce(e["query"], e["target"], tau=t.tau, labels_B=batch["label"])

    def dataset(split, *, shard, seed):
        make_pair = text.pair if fmt.families == "text" else examples.pair
        example = functools.partial(make_pair, s=train_split, fmt=fmt)
        return data.synthetic(example, global_batch=config.train.batch_size, seed=seed, shard=shard)

    def evaluate(state, *, seed):
        del seed
        if not t.eval_queries:
            return {}
        return validation_precision(config, jax.jit(embed_fn), jax.device_get(state.params))

    common = dict(init=init, tx=tx, dataset=dataset, evaluate=evaluate)
    if t.grad_cache_chunks:
        step = contrastive.cached_gradient_step(embed_fn, objective, tx, chunks=t.grad_cache_chunks)
        return Method(
            step=lambda state, batch, *, rng: step(state, _sides(batch), rng=rng), **common
        )

    def loss(params, batch, *, rng=None, extra=None):
        del rng, extra
        b = _sides(batch)
        e = {side: embed_fn(params, b[side]) for side in ("query", "target")}
        return objective(e, b)

    return Method(loss=loss, **common)
