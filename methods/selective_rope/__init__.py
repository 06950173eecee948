"""Selective RoPE (paper 5): input-dependent rotary position embeddings, on state tracking.

`make(config)` returns a `core.Method`; the pure functions are usable on their own:

    cfg = model_config(config)                       # a frozen model.ModelConfig
    params = model.init_params(cfg, rng)
    logits_BTC, angles = model.apply(cfg, params, tokens_BT)
    loss, metrics = loss_fn(cfg, params, batch)
    metrics = evaluate_lengths(cfg, params, config, seed=0)

The model, the position encodings and the GLA recurrence are in `model.py`; the data are the
shared synthetic generators (`core.tasks`: prefix parity, MQAR).
"""

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from core import data, tasks, train
from core.errors import ConfigError
from core.method import Method
from core.metrics import NonFiniteLossError
from core.precision import compute_dtype
from methods.selective_rope import model

# Held-out examples come from seed streams training never uses: one to choose hyperparameters
# on, one to report (a training seed s draws from s; the splits from s + offset).
SPLIT_SEED_OFFSETS = {"test": 1_000_003, "validation": 2_000_003}
EVAL_SEED_OFFSET = SPLIT_SEED_OFFSETS["test"]
EVAL_TOKENS_PER_BATCH = 32_768  # eval batch = this // length (softmax scores are B*H*T*T)


def make_task(config, **overrides):
    options = {k: v for k, v in config.task.items() if k != "name"} | overrides
    try:
        return tasks.make_task(config.task.name, **options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"task: {e}") from None


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


@functools.partial(jax.jit, static_argnums=0)
def _correct(cfg, params, inputs_BT, targets_BT):
    logits_BTC, _ = model.apply(cfg, params, inputs_BT, mask_BT=token_mask(inputs_BT))
    return jnp.argmax(logits_BTC, -1) == targets_BT


def accuracy(cfg, params, task, *, num_examples: int, seed: int, split: str = "test") -> dict:
    """Teacher-forced accuracy on held-out examples of `task` (possibly longer than training),
    drawn from `split`'s stream ("test" or "validation", disjoint seeds):

    accuracy      over all masked positions;
    last_half     over masked positions t >= T/2 (T = the task's padded length);
    last_quarter  over masked positions t >= 3T/4 (for parity: long prefixes, where
                  position-only models are at chance);
    final         at each sequence's last masked position (parity: of the whole sequence);
    exact_match   every masked position right.
    """
    if split not in SPLIT_SEED_OFFSETS:
        raise ConfigError(f"split={split!r}; expected one of: {', '.join(SPLIT_SEED_OFFSETS)}")
    T = task.seq_len
    batch_size = max(1, EVAL_TOKENS_PER_BATCH // T)
    t = np.arange(T)[None]
    sums = dict.fromkeys(("hit", "n", "hit_half", "n_half", "hit_q", "n_q", "final", "exact"), 0.0)
    for start in range(0, num_examples, batch_size):
        n = min(batch_size, num_examples - start)
        rngs = [
            np.random.default_rng([seed + SPLIT_SEED_OFFSETS[split], start + j]) for j in range(n)
        ]
        batch = data.stack([task.example(r) for r in rngs])
        correct = np.asarray(_correct(cfg, params, batch["inputs"], batch["targets"]))
        mask = batch["mask"] > 0
        half, quarter = mask & (t >= T // 2), mask & (t >= (3 * T) // 4)
        sums["hit"] += (correct & mask).sum()
        sums["n"] += mask.sum()
        sums["hit_half"] += (correct & half).sum()
        sums["n_half"] += half.sum()
        sums["hit_q"] += (correct & quarter).sum()
        sums["n_q"] += quarter.sum()
        sums["exact"] += np.all(correct | ~mask, axis=1).sum()
        last_T = T - 1 - np.argmax(mask[:, ::-1], axis=1)
        sums["final"] += correct[np.arange(n), last_T].sum()
    return {
        "accuracy": float(sums["hit"] / max(sums["n"], 1)),
        "last_half": float(sums["hit_half"] / max(sums["n_half"], 1)),
        "last_quarter": float(sums["hit_q"] / max(sums["n_q"], 1)),
        "final": float(sums["final"] / num_examples),
        "exact_match": float(sums["exact"] / num_examples),
    }


def evaluate_lengths(cfg, params, config, *, seed: int, split: str = "test", lengths=None) -> dict:
    """Parity: `accuracy` at the training length and at each of `config.eval.lengths` (or at
    `lengths`), keyed "len{T}/{metric}". Other tasks: `accuracy` on the training task, keyed
    "{metric}"."""
    n = config.eval.num_examples
    if config.task.name != "parity":
        return accuracy(cfg, params, make_task(config), num_examples=n, seed=seed, split=split)
    if lengths is None:
        lengths = sorted({config.task.length, *config.eval.lengths})
    out = {}
    for length in lengths:
        task = make_task(config, length=length, min_length=None)
        for k, v in accuracy(cfg, params, task, num_examples=n, seed=seed, split=split).items():
            out[f"len{length}/{k}"] = v
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

    def init(rng, batch_spec):
        del batch_spec
        return {"params": model.init_params(cfg, rng)}

    def dataset(split, *, shard, seed):
        offset = 0 if split == "train" else EVAL_SEED_OFFSET
        return data.synthetic(
            task.example, global_batch=config.train.batch_size, seed=seed + offset, shard=shard
        )

    def evaluate(state, *, seed):
        return evaluate_lengths(cfg, state.params, config, seed=seed)

    return Method(
        init=init,
        loss=functools.partial(loss_fn, cfg),
        dataset=dataset,
        evaluate=evaluate,
        sharding_rules=model.SHARDING_RULES,
    )


def train_and_evaluate(config, workdir: str) -> dict:
    """One run of the experiment (one CPU device): train, then {"validation": accuracy at the
    training length on the validation stream, "test": `evaluate_lengths` on the test stream,
    "flip_error" (parity, selective), "diverged", "seconds"}. A diverged run scores chance (0.5)
    everywhere: it is kept in the grid, not dropped."""
    start = time.perf_counter()
    cfg = model_config(config)
    try:
        result = train.run(config, make(config), workdir, devices=jax.devices()[:1])
    except NonFiniteLossError as e:
        print(f"   diverged: {e}", flush=True)
        return {"diverged": 1.0, "seconds": time.perf_counter() - start}
    params = result.state.params
    out = {
        "validation": evaluate_lengths(
            cfg, params, config, seed=config.seed, split="validation", lengths=[config.task.length]
        ),
        "test": evaluate_lengths(cfg, params, config, seed=config.seed),
        "diverged": 0.0,
    }
    if config.task.name == "parity" and cfg.position == "selective":
        out.update(parity_flip(cfg, params))
    return {**out, "seconds": time.perf_counter() - start}
