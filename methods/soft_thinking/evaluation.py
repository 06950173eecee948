"""Scoring decoders on the task: pass@k, agreement with the greedy chain, the JS probe summary
and the logit lens at branch points.

    out = decode(cfg, params, task, terms_BN, decoder=DECODERS["gumbel"], rng=key, samples=16)
    out = decode_prompts(cfg, params, prompts_BP, prompt_mask_BP=mask_BP, decoder=...,
                         rng=key, think_end_id=..., eos_id=..., max_new_tokens=128)  # any LM
    scores = score(task, terms_BN, out)              # correct / valid trace per sample
    pass_at_k(n=16, c=correct.sum(0), k=4)           # the unbiased estimator
    rouge_l(chain, greedy_chain)                     # LCS F-measure of two token chains
    lens = logit_lens(cfg, params, task, sequences_BT, temperature=0.6)
    lens = lens_at(cfg, params, sequences_BT, branch_points_at(...), limit=32, chunk=8)

The decoders use the paper's settings, untuned: token sampling at temperature 0.6, top-p 0.95,
top-k 30; soft thinking with max_topk 10 on the same truncation; Dirichlet alpha 4; Gumbel tau
0.5 (`DECODERS`).
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from core.nn import transformer
from methods.soft_thinking import task as task_lib
from methods.soft_thinking.decode import Decoder, generate_jit

DECODERS = {
    "greedy": Decoder("greedy"),
    "sample": Decoder("sample", temperature=0.6, top_k=30, top_p=0.95),
    "soft": Decoder("soft", temperature=0.6, top_k=30, top_p=0.95, max_topk=10),
    "dirichlet": Decoder(
        "dirichlet", temperature=0.6, top_k=30, top_p=0.95, max_topk=10, alpha=4.0
    ),
    "gumbel": Decoder("gumbel", temperature=0.6, top_k=30, top_p=0.95, max_topk=10, tau=0.5),
}
STOCHASTIC = ("sample", "soft", "dirichlet", "gumbel")  # the decoders drawn several times
PASS_K = (1, 2, 4, 8, 16)  # the k of pass@k
SLACK = 3  # tokens past the completion's length before a decode is cut (a long scratchpad)
MIX = (0.6, 0.4)  # the logit lens's hand-made mixture of the top-2 embeddings (the paper's)
BRANCH_PROB = 0.3  # a branch point: the second most likely token has at least this probability
LENS_TOP_K = 3  # top-k sets compared by the logit lens (of a vocabulary of p + 4 tokens)


def decode(cfg, params, task, terms_BN, *, decoder, rng, samples=1, probe=False, chunk=1024):
    """`decode_prompts` on the task's prompts, with its delimiter, eos and length."""
    return decode_prompts(
        cfg,
        params,
        task.prompt_tokens(terms_BN),
        decoder=decoder,
        rng=rng,
        think_end_id=task_lib.THINK_END,
        eos_id=task_lib.EOS,
        max_new_tokens=task.completion_len + SLACK,
        samples=samples,
        probe=probe,
        chunk=chunk,
        pad_id=task_lib.PAD,
    )


def decode_prompts(
    cfg,
    params,
    prompts_BP,
    *,
    decoder,
    rng,
    think_end_id,
    eos_id,
    max_new_tokens,
    prompt_mask_BP=None,
    samples=1,
    probe=False,
    chunk=1024,
    pad_id=0,
):
    """`samples` decodes of every (left-padded) prompt (rows s * B + b), in chunks of `chunk`
    rows so that every chunk is one compiled program. Returns numpy arrays: completion_SBN
    (pad_id after the end), think_end_SB, length_SB (tokens generated, eos included), and with
    probe=True js_top1_SBN, js_top2_SBN, probe_mask_SBN."""
    prompts = np.tile(np.asarray(prompts_BP), (samples, 1))
    masks = None if prompt_mask_BP is None else np.tile(np.asarray(prompt_mask_BP), (samples, 1))
    rows = len(prompts)
    chunk = min(chunk, rows)
    pad = -rows % chunk
    prompts = np.concatenate([prompts, np.repeat(prompts[:1], pad, axis=0)])
    if masks is not None:
        masks = np.concatenate([masks, np.repeat(masks[:1], pad, axis=0)])
    policy = transformer.policy(cfg)
    parts = []
    for index, start in enumerate(range(0, len(prompts), chunk)):
        out = generate_jit(
            policy,
            params,
            jnp.asarray(prompts[start : start + chunk]),
            rng=jax.random.fold_in(rng, index),
            decoder=decoder,
            think_end_id=think_end_id,
            eos_id=eos_id,
            max_new_tokens=max_new_tokens,
            prompt_mask_BP=None if masks is None else jnp.asarray(masks[start : start + chunk]),
            probe=probe,
        )
        parts.append(jax.device_get(out))
    B = len(prompts_BP)

    def stack(field):
        joined = np.concatenate([np.asarray(getattr(p, field)) for p in parts])[:rows]
        return joined.reshape(samples, B, *joined.shape[1:])

    tokens = np.where(stack("mask_BN"), stack("tokens_BN"), pad_id)
    result = {
        "completion_SBN": tokens,
        "think_end_SB": stack("think_end_B"),
        "length_SB": stack("lengths_B"),
    }
    if probe:
        result |= {
            "js_top1_SBN": stack("js_top1_BN"),
            "js_top2_SBN": stack("js_top2_BN"),
            "probe_mask_SBN": stack("soft_BN"),
        }
    return result


def chains(out) -> list[list[np.ndarray]]:
    """[s][b] the thinking tokens of each decode: everything before the delimiter (the whole
    decode when it never came)."""
    completion, ends = out["completion_SBN"], out["think_end_SB"]
    return [
        [row[: end if end >= 0 else len(row)] for row, end in zip(rows, row_ends, strict=True)]
        for rows, row_ends in zip(completion, ends, strict=True)
    ]


def score(task, terms_BN, out) -> dict[str, np.ndarray]:
    """correct_SB (the answer after the first delimiter) and valid_trace_SB."""
    per_sample = [task.score(terms_BN, completion) for completion in out["completion_SBN"]]
    return {k: np.stack([s[k] for s in per_sample]) for k in ("correct", "valid_trace")}


def pass_at_k(n: int, c: np.ndarray, k: int) -> np.ndarray:
    """The unbiased pass@k of each prompt from c correct of n samples: 1 - C(n-c,k) / C(n,k)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n={n}, got k={k}")
    c = np.asarray(c)
    return np.array([1.0 - math.comb(n - ci, k) / math.comb(n, k) for ci in c.ravel()]).reshape(
        c.shape
    )


def lcs_length(a, b) -> int:
    """Length of the longest common subsequence of two token sequences."""
    a, b = list(a), list(b)
    row = [0] * (len(b) + 1)
    for x in a:
        prev_diag = 0
        for j, y in enumerate(b, start=1):
            prev_diag, row[j] = row[j], prev_diag + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def rouge_l(a, b) -> float:
    """ROUGE-L F-measure (beta = 1): 2 LCS / (|a| + |b|); 1 for two empty chains."""
    if len(a) + len(b) == 0:
        return 1.0
    return 2.0 * lcs_length(a, b) / (len(a) + len(b))


def agreement_with(reference: list[np.ndarray], chains_SB) -> float:
    """Mean ROUGE-L of every decode's chain (chains_SB[s][b], e.g. `chains(out)`) against the
    reference chain of its prompt."""
    values = [
        rouge_l(chain, reference[b])
        for per_sample in chains_SB
        for b, chain in enumerate(per_sample)
    ]
    return float(np.mean(values))


def distinct_chains(chains_SB) -> float:
    """Mean number of distinct thinking chains per prompt over its samples."""
    per_prompt = zip(*chains_SB, strict=True)
    return float(np.mean([len({tuple(c) for c in samples}) for samples in per_prompt]))


def lens_metrics(lens: dict) -> dict[str, float]:
    """A logit lens result (`logit_lens` / `lens_at`) as flat row metrics: branch points and
    the per-layer top-k overlaps of the mixture with the top-1 and the top-2 input."""
    row = {"lens/branch_points": lens["branch_points"]}
    for layer, (top1, top2) in enumerate(
        zip(lens["mix_vs_top1"], lens["mix_vs_top2"], strict=True)
    ):
        row[f"lens/mix_vs_top1/{layer}"] = top1
        row[f"lens/mix_vs_top2/{layer}"] = top2
    return row


def probe_summary(out) -> dict[str, float]:
    """Mean JS (nats) of the next-token distribution after the soft input against after the
    top-1 and after the top-2 token alone, over the soft steps the probe is valid on."""
    valid = out["probe_mask_SBN"].astype(bool)
    top1 = float(out["js_top1_SBN"][valid].mean()) if valid.any() else float("nan")
    top2 = float(out["js_top2_SBN"][valid].mean()) if valid.any() else float("nan")
    return {"js_top1": top1, "js_top2": top2, "probe_steps": int(valid.sum())}


def branch_points(cfg, params, task, sequences_BT, temperature: float, limit: int):
    """Scratchpad positions of the greedy sequences where the tempered next-token distribution
    gives the second token at least BRANCH_PROB: (row, input position of the next token, top-1
    id, top-2 id), at most `limit` of them (the first in row-major order)."""
    # Positions whose prediction is a scratchpad token: from "=" to the last running sum.
    first = task.prompt_len - 1
    scratch_BT = np.zeros(sequences_BT.shape, bool)
    scratch_BT[:, first : first + 2 * task.num_terms] = True
    return branch_points_at(cfg, params, sequences_BT, scratch_BT, temperature, limit)


def branch_points_at(
    cfg, params, sequences_BT, predicts_BT, temperature: float, limit: int, rows_chunk=None
):
    """`branch_points` at the positions where predicts_BT is True (a position predicts the next
    one's token); the model is applied to `rows_chunk` rows at a time (None: all at once).
    Sequences are right-padded, so a row's padding never reaches its real tokens (causal)."""
    sequences_BT = np.asarray(sequences_BT)
    step = rows_chunk or len(sequences_BT)
    top2_prob, order = [], []
    for start in range(0, len(sequences_BT), step):
        logits_BTV, _ = transformer.apply(
            cfg, params, jnp.asarray(sequences_BT[start : start + step])
        )
        # top_k ranks ties lower id first, as a stable argsort of -p would.
        probs_BT2, order_BT2 = jax.lax.top_k(jax.nn.softmax(logits_BTV / temperature, axis=-1), 2)
        top2_prob.append(np.asarray(probs_BT2[..., 1]))
        order.append(np.asarray(order_BT2))
    top2_prob_BT, order_BT2 = np.concatenate(top2_prob), np.concatenate(order)
    rows, positions = np.nonzero(np.asarray(predicts_BT) & (top2_prob_BT >= BRANCH_PROB))
    rows, positions = rows[:limit], positions[:limit]
    return (
        rows,
        positions + 1,  # where the chosen token is fed back
        order_BT2[rows, positions, 0],
        order_BT2[rows, positions, 1],
    )


@functools.partial(jax.jit, static_argnames=("cfg",))
def _lens_logits(cfg, params, sequences_RT, at_R, first_R, second_R, weight_first):
    """Logit-lens logits [R, L, V] at position at_R when that position's input embedding is
    weight_first * E[first] + (1 - weight_first) * E[second] (same tokens elsewhere)."""
    embed_RTD = transformer.embed(cfg, params, sequences_RT).astype(jnp.float32)
    table_VD = params["embed"]["embedding"].astype(jnp.float32)
    mix_RD = weight_first * table_VD[first_R] + (1.0 - weight_first) * table_VD[second_R]
    rows = jnp.arange(sequences_RT.shape[0])
    embed_RTD = embed_RTD.at[rows, at_R].set(mix_RD)
    names = tuple(f"blocks/{i}" for i in range(cfg.num_layers))
    out = transformer.forward(cfg, params, embeddings_BTD=embed_RTD, capture=names, head=False)
    resid_RLD = jnp.stack([out.captured[n][rows, at_R] for n in names], axis=1)
    return transformer.head(cfg, params, resid_RLD)


def top_k_overlap(a_RLV, b_RLV, k: int) -> np.ndarray:
    """|top-k(a) & top-k(b)| / k per row and layer."""
    top_a = np.argsort(-np.asarray(a_RLV), axis=-1, kind="stable")[..., :k]
    top_b = np.argsort(-np.asarray(b_RLV), axis=-1, kind="stable")[..., :k]
    same = (top_a[..., :, None] == top_b[..., None, :]).any(-1)
    return same.sum(-1) / k


def logit_lens(cfg, params, task, sequences_BT, *, temperature: float, limit: int = 512):
    """Per layer, the mean top-k overlap of the logit lens at branch points between the 0.6/0.4
    mixture of the top-2 embeddings and the top-1 token alone, and between the mixture and the
    top-2 token alone; and how many branch points there were."""
    points = branch_points(cfg, params, task, sequences_BT, temperature, limit)
    return lens_at(cfg, params, sequences_BT, points, limit=limit, chunk=limit)


def lens_at(cfg, params, sequences_BT, points, *, limit: int, chunk: int):
    """`logit_lens` at given branch points (row, position, top-1, top-2), `chunk` rows per
    compiled program (the last chunk padded with repeats of the first point)."""
    rows, at, first, second = points
    if len(rows) == 0:
        nan = [float("nan")] * cfg.num_layers
        return {"mix_vs_top1": nan, "mix_vs_top2": nan, "branch_points": 0}
    keep = len(rows)
    index = np.concatenate([np.arange(keep), np.zeros(-keep % chunk, int)])
    outputs = {w: [] for w in (MIX[0], 1.0, 0.0)}
    for start in range(0, len(index), chunk):
        part = index[start : start + chunk]
        seq = jnp.asarray(np.asarray(sequences_BT)[rows[part]])
        args = (cfg, params, seq, *(jnp.asarray(a[part]) for a in (at, first, second)))
        for w in outputs:
            outputs[w].append(np.asarray(_lens_logits(*args, jnp.float32(w))))
    mix, top1, top2 = (np.concatenate(outputs[w])[:keep] for w in (MIX[0], 1.0, 0.0))
    return {
        "mix_vs_top1": top_k_overlap(mix, top1, LENS_TOP_K).mean(0).tolist(),
        "mix_vs_top2": top_k_overlap(mix, top2, LENS_TOP_K).mean(0).tolist(),
        "branch_points": keep,
    }
