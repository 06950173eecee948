"""Parallel Token Prediction (paper 19, `flow_mtp`): a student that emits L tokens in one call,
distilled from an autoregressive teacher through the teacher's inverse CDF (O-PTP).

`make(config) -> core.Method`; the pure functions below are usable on their own:

    teacher = make_teacher(config)
    cfg = student_config(config)
    params = model.init_params(cfg, rng)
    loss, metrics = loss_fn(cfg, teacher, transform, params, batch, rng=rng)

A batch is {"context": int32 [B, C] (left-padded), "context_mask": bool [B, C], "completion":
int32 [B, L]}: a teacher sample split at a random point. The loss computes the teacher's
distributions at the L completion positions (one teacher call over context + completion: the
distribution for position p comes from the logits at p - 1), the bin of each observed token,
u inside it (Beta(0.3, 0.3) in training, uniform in evaluation), and the cross-entropy of the
student's slot logits against the observed tokens. `correct` is the number of leading slots
whose argmax equals the teacher's token (the paper's metric, per completion).

Modules: `bins` (edges, u, pick, verify), `teacher` (toy teacher), `model` (student), `decode`
(proposal + verification rounds), `experiment`, `bench`.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core import data
from core.errors import ConfigError
from core.method import Method
from core.nn import transformer
from core.precision import compute_dtype
from methods.flow_mtp import bins, model
from methods.flow_mtp import teacher as teachers

TEACHERS = {"increasing_sequence": teachers.increasing_sequence}
# Held-out streams no training example comes from: validation (for any choice) and test.
EVAL_SEED_OFFSETS = {"validation": 1_000_003, "test": 2_000_003}


def make_teacher(config) -> teachers.MarkovTeacher:
    name = config.teacher.name
    if name not in TEACHERS:
        known = ", ".join(TEACHERS)
        raise ConfigError(f"teacher.name={name!r} is unknown; expected one of: {known}")
    return TEACHERS[name](config.teacher.vocab_size)


def sampling_transform(config) -> bins.SamplingTransform:
    t = config.teacher
    if not t.temperature > 0 or t.top_k < 0 or not 0 < t.top_p <= 1:
        raise ConfigError(
            f"teacher sampling: temperature={t.temperature} must be > 0, top_k={t.top_k} >= 0, "
            f"top_p={t.top_p} in (0, 1]"
        )
    return bins.SamplingTransform(t.temperature, t.top_k, t.top_p)


def student_config(config) -> model.StudentConfig:
    m, p = config.model, config.ptp
    try:
        net = transformer.TransformerConfig(
            vocab_size=config.teacher.vocab_size,
            num_layers=m.num_layers,
            d_model=m.d_model,
            num_heads=m.num_heads,
            d_ff=m.d_ff,
            max_len=p.context_len + p.completion_len,
            position="rope",
            dtype=compute_dtype(config.dtype),
        )
        return model.StudentConfig(
            net,
            p.context_len,
            p.completion_len,
            num_anchors=p.num_anchors,
            use_u=p.use_u,
            shift_positions=p.shift_positions,
        )
    except ValueError as e:
        raise ConfigError(f"model/ptp: {e}") from None


def example(teacher, edges_VE, context_len: int, completion_len: int, max_start: int, rng):
    """One teacher sequence from its start token, cut at a uniform point s in [1, max_start]:
    the completion is tokens [s, s + L), the context the last min(s, C) tokens before it
    (left-padded to C with token 0, masked). A window of C tokens is what the student and
    decoding see (exact for the toy teacher, whose next token depends on the last one); cuts
    far beyond C put larger token values in the data, as long decoding reaches them."""
    batch = examples(teacher, edges_VE, context_len, completion_len, max_start, [rng])
    return {k: v[0] for k, v in batch.items()}


def examples(teacher, edges_VE, context_len: int, completion_len: int, max_start: int, rngs):
    """`example` for each generator, the teacher's sampling vectorised over them
    (`core.data.synthetic(examples_fn=)`: the same stream)."""
    starts = [int(rng.integers(1, max_start + 1)) for rng in rngs]
    seqs = teacher.sample_many(rngs, [s + completion_len for s in starts], edges_VE)
    rows = []
    for s, seq in zip(starts, seqs, strict=True):
        n = min(s, context_len)
        context = np.zeros(context_len, np.int32)
        context[context_len - n :] = seq[s - n : s]
        rows.append(
            {
                "context": context,
                "context_mask": np.arange(context_len) >= context_len - n,
                "completion": seq[s:],
            }
        )
    return data.stack(rows)


def teacher_probs(teacher, transform, batch) -> jax.Array:
    """The teacher's sampling distributions [B, L, V] at the completion's positions: logits at
    position p - 1 (the last context token for slot 1), after the sampling transform."""
    tokens_BT = jnp.concatenate([batch["context"], batch["completion"]], axis=1)
    C, L = batch["context"].shape[1], batch["completion"].shape[1]
    logits_BLV = teacher.logits(tokens_BT)[:, C - 1 : C - 1 + L]
    return bins.sampling_probs(logits_BLV, transform)


def completion_metrics(logits_BLV, completion_BL):
    """Per-row NLL (mean over slots), correct leading tokens, and token accuracy."""
    log_probs = jax.nn.log_softmax(logits_BLV)
    nll_BL = -jnp.take_along_axis(log_probs, completion_BL[..., None], axis=-1)[..., 0]
    predicted_BL = jnp.argmax(logits_BLV, axis=-1)
    return {
        "nll_B": nll_BL.mean(-1),
        "correct_B": bins.leading_matches(predicted_BL, completion_BL).astype(jnp.float32),
        "accuracy_B": (predicted_BL == completion_BL).mean(-1),
    }


def _forward(cfg, teacher, transform, params, batch, rng, *, train: bool, beta: float):
    left_BL, right_BL = bins.bins_of(teacher_probs(teacher, transform, batch), batch["completion"])
    u_BL = bins.sample_u(rng, left_BL, right_BL, train=train, concentration=beta)
    logits_BLV = model.student_logits(cfg, params, batch["context"], batch["context_mask"], u_BL)
    return completion_metrics(logits_BLV, batch["completion"])


def loss_fn(cfg, teacher, transform, params, batch, *, rng, extra=None, beta: float = 0.3):
    """O-PTP: cross-entropy of the slots against the teacher's tokens, u ~ Beta in the bins."""
    del extra
    m = _forward(cfg, teacher, transform, params, batch, rng, train=True, beta=beta)
    metrics = {"correct": m["correct_B"].mean(), "accuracy": m["accuracy_B"].mean()}
    return m["nll_B"].mean(), metrics


def eval_step(cfg, teacher, transform, state, batch, *, rng) -> dict:
    """Held-out (sum, weight) pairs with u ~ U(0, 1) in the bins (as sampling the teacher
    gives): correct leading tokens per completion, token accuracy, NLL per token."""
    m = _forward(cfg, teacher, transform, state.params, batch, rng, train=False, beta=0.3)
    rows = jnp.float32(batch["completion"].shape[0])
    return {name.removesuffix("_B"): (jnp.sum(v), rows) for name, v in m.items()}


def make(config) -> Method:
    cfg = student_config(config)
    teacher = make_teacher(config)
    transform = sampling_transform(config)
    edges_VE = teacher.edges_VE(transform)
    C, L = cfg.context_len, cfg.completion_len
    split = config.eval.split
    if split not in EVAL_SEED_OFFSETS:
        raise ConfigError(f"eval.split={split!r}; expected one of: {', '.join(EVAL_SEED_OFFSETS)}")
    num_eval, batch_size = config.eval.num_examples, config.train.batch_size
    if num_eval % batch_size:
        raise ConfigError(
            f"eval.num_examples={num_eval} must be a multiple of train.batch_size={batch_size}"
        )
    max_start = config.ptp.max_start
    if not 1 <= max_start <= teacher.vocab_size:
        raise ConfigError(f"ptp.max_start={max_start} must be in [1, teacher.vocab_size]")
    examples_fn = functools.partial(examples, teacher, edges_VE, C, L, max_start)

    def init(rng, batch_spec):
        del batch_spec
        return {"params": model.init_params(cfg, rng)}

    def dataset(which, *, shard, seed):
        if which == "eval":
            return data.synthetic(
                examples_fn=examples_fn,
                global_batch=batch_size,
                seed=seed + EVAL_SEED_OFFSETS[split],
                shard=shard,
                num_batches=num_eval // batch_size,
            )
        return data.synthetic(
            examples_fn=examples_fn, global_batch=batch_size, seed=seed, shard=shard
        )

    return Method(
        init=init,
        loss=functools.partial(loss_fn, cfg, teacher, transform, beta=config.ptp.beta),
        dataset=dataset,
        eval_step=functools.partial(eval_step, cfg, teacher, transform),
        sharding_rules=transformer.SHARDING_RULES,
    )
