"""Test-time traces from the inputs alone, and the query sides they make.

    perceived = perceive(clf_params, q)                     # [n, 2]: the classifier's digits
    words = teacher(q, perceived, style="full", rho=0.0, seed=0)   # TTE_t (noisy: rho > 0)
    words = reasoner(cfg, reasoner_params, q)               # TTE_s: greedy decoding
    image, tokens = query_sides(q, words, trace_only=False)

The teacher at test time is the programmatic oracle over what a strong recogniser sees (the
digits classifier, trained on the train split only): the paper's 72B teacher reads the image, it
does not see the label. The reasoner decodes greedily with the shared sampler
(`core.nn.sampler` over `core.nn.vlm.policy`) from [image; instruction]. Neither reads
`Queries.shown` or `Queries.answer` (tests/methods/test_tte.py shuffles them to check).
"""

import jax
import jax.numpy as jnp
import numpy as np

from core import digits
from core.nn import sampler, vlm
from methods.tte import examples, tasks


def perceive(clf_params, q: examples.Queries) -> np.ndarray:
    """[n, 2] digits the classifier reads in each shown slot; -1 where the slot is empty."""
    slots = q.slots.reshape(-1, 8, 8, 1)
    predicted = digits.predict(clf_params, slots).reshape(-1, 2)
    empty = np.all(q.slots <= -1.0, axis=(2, 3))
    return np.where(empty, -1, predicted)


def teacher(q: examples.Queries, perceived_N2, *, style: str, rho: float, seed: int) -> list:
    """The oracle's trace words per query from perceived digits (noisy at rate rho)."""
    rng = np.random.default_rng([seed, tasks.FAMILIES.index(q.family), 7])
    out = []
    for d, k in zip(perceived_N2, q.k, strict=True):
        d = tasks.corrupt(tuple(int(v) for v in d), rho, rng)
        out.append(tasks.trace_words(q.family, d, int(k), style))
    return out


def prompts(cfg: vlm.VLMConfig, q: examples.Queries):
    """Left-padded [n, N + INSTRUCTION_LEN] prompts: image placeholders, then the instruction."""
    N, width = cfg.num_image_tokens, cfg.num_image_tokens + tasks.INSTRUCTION_LEN
    rows = [[tasks.IMG] * N + tasks.encode(tasks.instruction(q.family, int(k))) for k in q.k]
    return sampler.left_pad(rows, width=width, pad_id=tasks.PAD)


def _image_embeddings(cfg, params, images):
    return vlm.image_embeddings(cfg, params, images)[0]


_image_embeddings = jax.jit(_image_embeddings, static_argnums=0)


def reasoner(cfg: vlm.VLMConfig, params, q: examples.Queries, batch: int = 512) -> list:
    """The reasoner's greedy trace words per query (up to its eos; at most TRACE_LEN words)."""
    policy = vlm.policy(cfg, tasks.IMG)
    tokens, mask = prompts(cfg, q)
    out = []
    for start in range(0, len(tokens), batch):
        sl = slice(start, start + batch)
        image_BND = _image_embeddings(cfg, params, jnp.asarray(q.image[sl]))
        sample = sampler.sample_jit(
            policy,
            {"model": params, "image_BND": image_BND},
            jnp.asarray(tokens[sl]),
            rng=jax.random.key(0),  # unused: greedy
            max_new_tokens=tasks.TRACE_LEN + 1,
            prompt_mask_BP=jnp.asarray(mask[sl]),
            temperature=0.0,
            eos_id=tasks.EOS,
            pad_id=tasks.PAD,
        )
        for ids in np.asarray(sample.tokens_BN):
            ids = list(ids)
            ids = ids[: ids.index(tasks.EOS)] if tasks.EOS in ids else ids[: tasks.TRACE_LEN]
            out.append([w for w in tasks.decode(ids) if w not in tasks.SPECIAL[:3]])
    return out


def query_sides(q: examples.Queries, words: list, *, trace_only: bool = False):
    """(images [n, 8, 16, 1], tokens [n, QUERY_LEN]) of the queries with these traces."""
    tokens = np.stack(
        [
            tasks.query_text(q.family, int(k), w, trace_only=trace_only)
            for k, w in zip(q.k, words, strict=True)
        ]
    )
    image = np.repeat(tasks.BLANK[None], len(tokens), 0) if trace_only else q.image
    return image, tokens
