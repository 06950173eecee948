"""Selective RoPE (paper 5): input-dependent rotary position embeddings, on state tracking.

`make(config)` returns a `core.Method`; the pure functions are usable on their own:

    cfg = model_config(config)                       # a frozen model.ModelConfig
    params = model.init_params(cfg, rng)
    logits_BTC, angles = model.apply(cfg, params, tokens_BT)
    loss, metrics = loss_fn(cfg, params, batch)
    streams = evaluators(cfg, config)               # parity: eval/len{T}/<metric> per length

The model, the position encodings and the GLA recurrence are in `model.py`; the data are the
shared synthetic generators (`core.tasks`: prefix parity, MQAR).
"""

import dataclasses
import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from core import data, tasks, train
from core.errors import ConfigError
from core.method import Evaluator, Method
from core.metrics import NonFiniteLossError
from core.precision import compute_dtype
from methods.selective_rope import model

# Held-out examples come from seed streams training never uses: one to choose hyperparameters
# on, one to report (a training seed s draws from s; the splits from s + offset).
SPLIT_SEED_OFFSETS = {"test": 1_000_003, "validation": 2_000_003}
EVAL_TOKENS_PER_BATCH = 32_768  # eval batch = this // length (softmax scores are B*H*T*T)


@dataclasses.dataclass(frozen=True)
class WithBOS:
    """`task`'s examples with a BOS token before every sequence, as the authors' state-tracking
    tokenizer writes them (`TemplateProcessing(single="[BOS] $A")`, main.py:237-242 at d12e825).
    BOS is a new token (id `task.vocab_size`); its position is not scored (mask 0, target PAD:
    the authors' loss also asks the model to copy BOS there, a free label). The same rng gives
    the same bits as `task`, one position later."""

    task: Any

    @property
    def bos(self) -> int:
        return self.task.vocab_size

    @property
    def vocab_size(self) -> int:
        return self.task.vocab_size + 1

    @property
    def seq_len(self) -> int:
        return self.task.seq_len + 1

    def batch(self, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
        first = {"inputs": self.bos, "targets": tasks.PAD, "mask": 0}
        return {
            k: np.concatenate([np.full_like(v[:, :1], first[k]), v], axis=1)
            for k, v in self.task.batch(rng, n).items()
        }

    def example(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
        return {k: v[0] for k, v in self.batch(rng, 1).items()}


def make_task(config, **overrides):
    """The task of `config` (`overrides` replace its options); with `task.bos` (parity only),
    each sequence starts with a BOS token (`WithBOS`)."""
    options = {k: v for k, v in config.task.items() if k not in ("name", "bos")} | overrides
    bos = bool(config.task.get("bos", False))
    if bos and config.task.name != "parity":
        raise ConfigError(f"task.bos=True needs task.name='parity', got {config.task.name!r}")
    try:
        task = tasks.make_task(config.task.name, **options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"task: {e}") from None
    return WithBOS(task) if bos else task


def model_config(config) -> model.ModelConfig:
    """The model of `config`, with RoPE/none widened to the selective variant's parameter count."""
    task = make_task(config)
    m = config.model
    try:
        cfg = model.ModelConfig(
            vocab_size=task.vocab_size,
            num_classes=task.vocab_size,
            model=m.kind,
            position=m.position,
            num_layers=m.num_layers,
            d_model=m.d_model,
            num_heads=m.num_heads,
            d_ff=m.d_ff,
            phi_parametrization=m.phi_parametrization,
            phi_rank=m.phi_rank,
            conv_size=m.conv_size,
            conv_silu=m.conv_silu,
            use_bias=m.use_bias,
            use_gate=m.use_gate,
            temp_type=m.temp_type,
            temp_theta=m.temp_theta,
            temp_max=m.temp_max,
            rotary_impl=m.rotary_impl,
            rope_base=m.rope_base,
            qk_norm=m.qk_norm,
            output_gate=m.output_gate,
            dtype=compute_dtype(config.dtype),
        )
    except ValueError as e:
        raise ConfigError(f"model: {e}") from None
    return model.matched(cfg) if m.match_params else cfg


def token_mask(tokens_BT):
    """Real tokens: every task pads with PAD = 0 and uses no PAD inside a sequence."""
    return tokens_BT != tasks.PAD


def loss_fn(cfg, params, batch, *, rng=None, extra=None):
    """Masked cross-entropy of per-position `targets`, averaged over `mask`ed positions."""
    del rng, extra
    logits_BTC, _ = model.apply(cfg, params, batch["inputs"], mask_BT=token_mask(batch["inputs"]))
    mask_BT = batch["mask"].astype(jnp.float32)
    log_probs_BTC = jax.nn.log_softmax(logits_BTC)
    nll_BT = -jnp.take_along_axis(log_probs_BTC, batch["targets"][..., None], axis=-1)[..., 0]
    denom = jnp.maximum(mask_BT.sum(), 1.0)
    correct_BT = (jnp.argmax(logits_BTC, -1) == batch["targets"]).astype(jnp.float32)
    metrics = {
        "accuracy": (correct_BT * mask_BT).sum() / denom,
        "num_tokens": jnp.asarray(batch["inputs"].size, jnp.float32),
    }
    return (nll_BT * mask_BT).sum() / denom, metrics


def split_examples(config, split: str, *, seed: int) -> dict[str, np.ndarray]:
    """`config.eval.num_examples` held-out examples of `split`: "test" / "validation" (the
    training task) or "test/len{T}" / "validation/len{T}" (parity at length T). Example i of
    stream s is drawn from `default_rng([seed + SPLIT_SEED_OFFSETS[s], i])`: disjoint from
    training (seed s draws from s) and from the other stream, and the same at any batch size.
    The task's per-position mask is renamed "positions" (`core.data.one_pass` adds "mask")."""
    stream, _, length = split.partition("/len")
    if stream not in SPLIT_SEED_OFFSETS or (length and not length.isdigit()):
        raise ConfigError(
            f"selective_rope: split={split!r}; expected one of {', '.join(SPLIT_SEED_OFFSETS)}, "
            "optionally followed by /len<T>"
        )
    task = make_task(config, length=int(length), min_length=None) if length else make_task(config)
    offset = seed + SPLIT_SEED_OFFSETS[stream]
    rngs = (np.random.default_rng([offset, i]) for i in range(config.eval.num_examples))
    batch = data.stack([task.example(r) for r in rngs])
    batch["positions"] = batch.pop("mask")
    return batch


def eval_batch_size(config, length: int) -> int:
    """Examples per eval batch at `length`: EVAL_TOKENS_PER_BATCH // length, at most the
    number of examples (a small split is one batch), rounded up to a multiple of
    `train.batch_size`, which splits over any mesh the run trains on (`core.data.one_pass`
    pads the rest). The experiment's batches are those of the host loop this replaced."""
    size = max(1, min(EVAL_TOKENS_PER_BATCH // length, config.eval.num_examples))
    return -(-size // config.train.batch_size) * config.train.batch_size


def held_out_counts(cfg, params, batch) -> dict:
    """Teacher-forced accuracy as {metric: (hits, count)} of one batch (the core adds them over
    a pass of the split and reports hits / count); rows with "mask" False are padding:

    accuracy      over all masked positions;
    last_half     over masked positions t >= T/2 (T = the task's padded length);
    last_quarter  over masked positions t >= 3T/4 (for parity: long prefixes, where
                  position-only models are at chance);
    final         at each sequence's last masked position (parity: of the whole sequence);
    exact_match   every masked position right.
    """
    inputs_BT = batch["inputs"]
    T = inputs_BT.shape[1]
    logits_BTC, _ = model.apply(cfg, params, inputs_BT, mask_BT=token_mask(inputs_BT))
    correct_BT = jnp.argmax(logits_BTC, -1) == batch["targets"]
    row_B = batch["mask"]
    scored_BT = (batch["positions"] > 0) & row_B[:, None]
    t_1T = jnp.arange(T)[None]
    half_BT, quarter_BT = scored_BT & (t_1T >= T // 2), scored_BT & (t_1T >= (3 * T) // 4)
    last_B = T - 1 - jnp.argmax(scored_BT[:, ::-1], axis=1)
    final_B = jnp.take_along_axis(correct_BT, last_B[:, None], axis=1)[:, 0] & row_B
    exact_B = jnp.all(correct_BT | ~scored_BT, axis=1) & row_B

    def count(x):  # float32 sums of 0/1 are exact below 2**24
        return jnp.sum(x, dtype=jnp.float32)

    return {
        "accuracy": (count(correct_BT & scored_BT), count(scored_BT)),
        "last_half": (count(correct_BT & half_BT), count(half_BT)),
        "last_quarter": (count(correct_BT & quarter_BT), count(quarter_BT)),
        "final": (count(final_B), count(row_B)),
        "exact_match": (count(exact_B), count(row_B)),
    }


def eval_lengths(config) -> list[int]:
    """Parity: the training length and each of `config.eval.lengths`."""
    return sorted({config.task.length, *config.eval.lengths})


def validation_lengths(config) -> list[int]:
    """Parity: the lengths scored on the validation stream, `config.eval.validation_lengths`
    (the re-test selects at 4x), by default the training length alone."""
    return sorted(set(config.eval.get("validation_lengths", None) or (config.task.length,)))


def evaluators(cfg, config) -> tuple[Evaluator, ...]:
    """Parity: one stream per test length, "len{T}" on split "test/len{T}" (logged
    eval/len{T}/<metric>), and "validation.len{T}" on the validation stream at each validation
    length (what an experiment selects on). Other tasks: none (the method's own eval_step)."""
    if config.task.name != "parity":
        return ()

    def eval_step(state, batch, *, rng):
        del rng
        return held_out_counts(cfg, state.params, batch)

    tests = [Evaluator(f"len{T}", eval_step, split=f"test/len{T}") for T in eval_lengths(config)]
    validation = [
        Evaluator(f"validation.len{T}", eval_step, split=f"validation/len{T}")
        for T in validation_lengths(config)
    ]
    return (*tests, *validation)


def split_metrics(row: dict) -> dict[str, dict[str, float]]:
    """One evaluation row's metrics by stream: {"validation": {"len{T}/<metric>": value},
    "test": {...}} (logged as eval/validation.len{T}/<metric> and eval/len{T}/<metric>)."""
    out = {"validation": {}, "test": {}}
    for key, value in row.items():
        if key.startswith("eval/validation.len"):
            out["validation"][key.removeprefix("eval/validation.")] = value
        elif key.startswith("eval/len"):
            out["test"][key.removeprefix("eval/")] = value
    return out


def parity_flip(cfg, params) -> dict:
    """How far the learned rotation is from the simplest length-free parity solution.

    For each rotation pair, |(step(1-bit) - step(0-bit) - pi) mod 2 pi| in radians
    (`model.steady_increments`): 0 when a 1-bit turns that pair by exactly pi more than a 0-bit,
    so that the pair's angle relative to the start flips with the parity at any length (an
    error e drifts by n * e after n 1-bits). Returns the best pair's {"flip_error"}. Other
    solutions exist (a quarter turn per 1-bit read out by the MLP through cos and sin, say),
    so a large error does not rule out extrapolation, nor a small one guarantee it."""
    steps = model.steady_increments(cfg, params, [tasks.PrefixParity.ZERO, tasks.PrefixParity.ONE])
    flip = np.abs(np.mod(steps[1] - steps[0], 2 * np.pi) - np.pi)  # [H, R], 0 = exact flip
    return {"flip_error": float(flip.min())}


def make(config) -> Method:
    cfg = model_config(config)
    task = make_task(config)
    held_out = {}  # (split, seed) -> the split's examples, drawn once per process

    def init(rng, batch_spec):
        del batch_spec
        return {"params": model.init_params(cfg, rng)}

    def dataset(split, *, shard, seed):
        if split == "train":
            return data.synthetic(
                task.example, global_batch=config.train.batch_size, seed=seed, shard=shard
            )
        split = "test" if split == "eval" else split  # the method's own stream: the test split
        if (split, seed) not in held_out:
            held_out[split, seed] = split_examples(config, split, seed=seed)
        arrays = held_out[split, seed]
        batch = eval_batch_size(config, arrays["inputs"].shape[1])
        return data.one_pass(arrays, global_batch=batch, shard=shard)

    def eval_step(state, batch, *, rng):
        del rng
        return held_out_counts(cfg, state.params, batch)

    streams = evaluators(cfg, config)
    return Method(
        init=init,
        loss=functools.partial(loss_fn, cfg),
        dataset=dataset,
        eval_step=None if streams else eval_step,  # other tasks: the training task's test split
        evaluators=streams,
        sharding_rules=model.SHARDING_RULES,
    )


def train_and_evaluate(config, workdir: str) -> dict:
    """One run of the experiment (one CPU device): train, then {"validation": the validation
    lengths' metrics on the validation stream, "test": every length's on the test stream (both
    "len{T}/<metric>", from the run's final evaluation), "flip_error" (parity, selective),
    "diverged", "seconds"}. A diverged run returns {"diverged": 1.0, "seconds"} only (the
    experiment scores it at chance: it stays in the grid, not dropped)."""
    start = time.perf_counter()
    cfg = model_config(config)
    if config.task.name != "parity" or config.train.eval_every < 0:
        raise ConfigError(
            "selective_rope: train_and_evaluate needs task.name='parity' and train.eval_every "
            f">= 0 (the final evaluation), got {config.task.name!r} and {config.train.eval_every}"
        )
    try:
        result = train.run(config, make(config), workdir, devices=jax.devices()[:1])
    except NonFiniteLossError as e:
        print(f"   diverged: {e}", flush=True)
        return {"diverged": 1.0, "seconds": time.perf_counter() - start}
    final = [r for r in result.history if any(k.startswith("eval/") for k in r)][-1]
    out = {**split_metrics(final), "diverged": 0.0}
    if cfg.position == "selective":
        out.update(parity_flip(cfg, result.state.params))
    return {**out, "seconds": time.perf_counter() - start}
