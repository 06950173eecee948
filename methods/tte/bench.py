"""Think-Then-Embed's systems side: the contrastive step with and without GradCache, the largest
contrastive batch each fits in a fixed memory budget, and the reasoner's decoding rate.

    python -m launch.bench --methods=tte           # the full experiment's model (configs/tte.py)
    python -m launch.bench --methods=tte --smoke   # seconds (the smoke model)

One process, float32, one device, untrained weights (the cost does not depend on them):
1. the embedder's training step (InfoNCE over a batch of query/target pairs with full traces),
   examples/s: the plain full-batch gradient against GradCache's two passes at the same batch
   (chunks of 64 rows);
2. the largest batch (powers of two) whose compiled step fits a budget of temporary memory, as
   XLA's buffer assignment reports it (`memory_analysis().temp_size_in_bytes`: the compiler's
   plan for this program, not a measured peak), for each of the two steps;
3. greedy decoding of ECR traces by the shared sampler (`core.nn.vlm.policy`), new tokens/s.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from core import contrastive, optim
from core.benchmark import Ratio, Result, machine, median_seconds
from core.nn import sampler, vlm
from core.state import TrainState
from methods.tte import embedder, examples, runs, tasks, traces

CHUNK_ROWS = 64  # GradCache's chunk: the rows whose activations live at once
BUDGET_MIB = 256


def _setup(smoke: bool):
    c = runs.role_config("smoke" if smoke else "small", 0, 1e-3, "embedder")
    cfg = embedder.model_config(c)
    embed_fn = functools.partial(embedder.embed, cfg)
    tx = optim.make(c.optim, c.train.steps)
    return c, cfg, embed_fn, tx


def _batch(n: int) -> dict:
    rng = np.random.default_rng(0)
    s = tasks.split("train")
    ex = [examples.pair(rng, s, examples.QueryFormat("full")) for _ in range(n)]
    b = {k: jnp.asarray(np.stack([e[k] for e in ex])) for k in ex[0]}
    return {
        "query": {"image": b["q_image"], "tokens": b["q_tokens"]},
        "target": {"image": b["t_image"], "tokens": b["t_tokens"]},
        "label": b["label"],
    }


def _steps(embed_fn, tx, tau, chunks):
    """{"plain": step, "grad_cache": step}: jitted (state, batch) -> (state, metrics)."""

    def objective(e, batch):
        return contrastive.info_nce(e["query"], e["target"], tau=tau, labels_B=batch["label"])

    def plain(state, batch):
        def loss(p):
            return objective({s: embed_fn(p, batch[s]) for s in ("query", "target")}, batch)

        (value, _), grads = jax.value_and_grad(loss, has_aux=True)(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = jax.tree.map(jnp.add, state.params, updates)
        return state.replace(params=params, opt_state=opt_state), value

    cached = contrastive.cached_gradient_step(embed_fn, objective, tx, chunks=chunks)
    return {
        "plain": jax.jit(plain),
        "grad_cache": jax.jit(lambda state, batch: cached(state, batch, rng=None)),
    }


def _state(cfg, tx):
    params = vlm.init_params(cfg, jax.random.key(0))
    return TrainState(jnp.zeros((), jnp.int32), jax.random.key(1), params, tx.init(params), {})


def _temp_mib(step, state, batch) -> float:
    analysis = step.lower(state, batch).compile().memory_analysis()
    return analysis.temp_size_in_bytes / 2**20


def largest_batch(embed_fn, tx, tau, state, sizes) -> dict:
    """{step: (largest batch within BUDGET_MIB or 0, {batch: temporary MiB})}."""
    out = {}
    for name in ("plain", "grad_cache"):
        mib = {}
        for n in sizes:
            step = _steps(embed_fn, tx, tau, max(1, n // CHUNK_ROWS))[name]
            mib[n] = _temp_mib(step, state, _batch(n))
            if mib[n] > BUDGET_MIB:
                break
        fits = [n for n, m in mib.items() if m <= BUDGET_MIB]
        out[name] = (max(fits) if fits else 0, mib)
    return out


def decode_rate(cfg, n: int) -> tuple[float, float]:
    """(new tokens/s, seconds per batch) of greedy trace decoding for n queries: the image
    encoded, the prompt prefilled and every row decoded to eos or TRACE_LEN + 1 tokens."""
    params = vlm.init_params(cfg, jax.random.key(0))
    q = examples.eval_queries(tasks.split("validation"), "larger", n, seed=0)
    prompt, mask = (jnp.asarray(a) for a in traces.prompts(cfg, q))
    images = jnp.asarray(q.image)

    def decode():
        image_BND = vlm.image_embeddings(cfg, params, images)[0]
        return sampler.sample(
            vlm.policy(cfg, tasks.IMG),
            {"model": params, "image_BND": image_BND},
            prompt,
            rng=jax.random.key(0),
            max_new_tokens=tasks.TRACE_LEN + 1,
            prompt_mask_BP=mask,
            temperature=0.0,
            eos_id=tasks.EOS,
            pad_id=tasks.PAD,
        ).lengths_B

    decode = jax.jit(decode)
    seconds = median_seconds(lambda: jax.block_until_ready(decode()), 3)
    return int(decode().sum()) / seconds, seconds


def measure(*, smoke: bool = False) -> Result:
    c, cfg, embed_fn, tx = _setup(smoke)
    batch_n = 64 if smoke else 512
    state, batch = _state(cfg, tx), _batch(batch_n)
    steps = _steps(embed_fn, tx, c.tte.tau, batch_n // CHUNK_ROWS)
    seconds = {
        name: median_seconds(lambda s=step: jax.block_until_ready(s(state, batch)), 3)
        for name, step in steps.items()
    }
    sizes = (64,) if smoke else (256, 512, 1024, 2048, 4096, 8192)
    fit = largest_batch(embed_fn, tx, c.tte.tau, state, sizes)
    tokens_per_s, decode_s = decode_rate(cfg, 64 if smoke else 512)
    ratios = [
        Ratio(
            f"contrastive step, batch {batch_n} (examples/s)",
            "plain full-batch gradient",
            batch_n / seconds["plain"],
            f"GradCache ({CHUNK_ROWS}-row chunks)",
            batch_n / seconds["grad_cache"],
            "examples/s",
        ),
        Ratio(
            f"largest batch within {BUDGET_MIB} MiB of temporaries (XLA's plan)",
            f"GradCache ({CHUNK_ROWS}-row chunks)",
            fit["grad_cache"][0],
            "plain full-batch gradient",
            fit["plain"][0],
            "examples",
        ),
    ]
    details = {
        "batch": batch_n,
        "step_seconds": seconds,
        "temp_mib": {name: {str(n): m for n, m in v[1].items()} for name, v in fit.items()},
        "largest_batch": {name: v[0] for name, v in fit.items()},
        "budget_mib": BUDGET_MIB,
        "decode_tokens_per_s": tokens_per_s,
        "decode_seconds": decode_s,
        "machine": machine(),
    }
    rate = f"{tokens_per_s:,.0f} new tokens/s ({decode_s * 1e3:.1f} ms a batch)"
    notes = [f"greedy ECR decoding: {rate}"]
    return Result(ratios, details, notes)
