"""Why vanilla soft's chain is not much closer to greedy's than sampling's (the failed chain
claim of the pretrained setting): where, and at what kind of step, the two chains part.

Vanilla soft takes the argmax of the same logits as greedy; only its mixed input embeddings
differ. So its chain equals greedy's until the first step whose argmax flips, and from there on
the two decodes are free to go apart. This module measures, on the full run's own test problems:
the share of identical chains, the first divergence position, ROUGE-L of the suffixes after it,
and greedy's top-2 probability gap at that step (a near tie flipped by the small JS shift?).

    python -m methods.soft_thinking.chain_divergence   # ~8 min on the 2 shared CPU cores
"""

import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from core.nn import transformer
from methods.soft_thinking import evaluation, pretrained_eval, problems
from methods.soft_thinking import experiment_pretrained as ep
from methods.soft_thinking.evaluation import DECODERS

RECORD = "methods/soft_thinking/results/full_pretrained.json"


def first_divergence(a, b) -> int:
    """The first index where chains a and b differ (one ending before the other counts as a
    difference there); -1 when they are equal."""
    a, b = np.asarray(a), np.asarray(b)
    shared = min(len(a), len(b))
    differ = np.flatnonzero(a[:shared] != b[:shared])
    if len(differ):
        return int(differ[0])
    return -1 if len(a) == len(b) else shared


def compare(greedy_chains, soft_chains) -> list[dict]:
    """Per problem: equal, first divergence, greedy chain length, ROUGE-L of the whole chains
    and of the suffixes from the first divergence on."""
    rows = []
    for g, s in zip(greedy_chains, soft_chains, strict=True):
        d = first_divergence(g, s)
        rows.append(
            {
                "equal": d < 0,
                "first": d,
                "greedy_length": len(g),
                "soft_length": len(s),
                "rouge_l": evaluation.rouge_l(s, g),
                "suffix_rouge_l": None if d < 0 else evaluation.rouge_l(s[d:], g[d:]),
            }
        )
    return rows


def top2_at(lm, prompts, greedy, positions) -> list[tuple[float, float, int, int]]:
    """Greedy's next-token (p1, p2, top-1 id, top-2 id) at chain step positions[b] (softmax at
    temperature 1 over the raw logits), given the prompt and greedy's own tokens before it.
    positions[b] < 0: None."""
    out = []
    completion = greedy["completion_SBN"][0]
    for b, d in enumerate(positions):
        if d < 0 or d >= greedy["length_SB"][0][b]:
            out.append(None)
            continue
        prompt = prompts.tokens_BP[b][prompts.mask_BP[b]]
        sequence = np.concatenate([prompt, completion[b][:d]])[None].astype(np.int32)
        logits_BTV, _ = transformer.apply(lm.cfg, lm.params, jnp.asarray(sequence))
        probs_V = jax.nn.softmax(logits_BTV[0, -1].astype(jnp.float32))
        p2, ids = jax.lax.top_k(probs_V, 2)
        out.append((float(p2[0]), float(p2[1]), int(ids[0]), int(ids[1])))
    return out


def chain_gaps(lm, prompts, greedy) -> list[np.ndarray]:
    """Per problem, greedy's top-1 minus top-2 probability (temperature 1) at every step of its
    chain: the base rate of near ties that a divergence step is compared with."""
    gaps = []
    completion, chains = greedy["completion_SBN"][0], pretrained_eval.chains(greedy)[0]
    for b, chain in enumerate(chains):
        prompt = prompts.tokens_BP[b][prompts.mask_BP[b]]
        sequence = np.concatenate([prompt, completion[b][: len(chain)]])[None].astype(np.int32)
        logits_BTV, _ = transformer.apply(lm.cfg, lm.params, jnp.asarray(sequence))
        # Positions len(prompt) - 1 ... predict chain steps 0 ... len(chain) - 1.
        probs_TV = jax.nn.softmax(logits_BTV[0, len(prompt) - 1 :].astype(jnp.float32), axis=-1)
        top_T2, _ = jax.lax.top_k(probs_TV, 2)
        gaps.append(np.asarray(top_T2[:-1, 0] - top_T2[:-1, 1]))
    return gaps


def quartiles(values) -> list[float]:
    return [float(q) for q in np.quantile(np.asarray(values, float), [0.25, 0.5, 0.75])]


def summarize(rows, all_gaps) -> dict:
    parted = [r for r in rows if not r["equal"]]
    gaps = [r["p1"] - r["p2"] for r in parted if r.get("p1") is not None]
    return {
        "problems": len(rows),
        "equal_share": float(np.mean([r["equal"] for r in rows])),
        "rouge_l_soft_greedy": float(np.mean([r["rouge_l"] for r in rows])),
        "first_divergence_quartiles": quartiles([r["first"] for r in parted]),
        "relative_first_quartiles": quartiles(
            [r["first"] / max(r["greedy_length"], 1) for r in parted]
        ),
        "suffix_rouge_l_mean": float(np.mean([r["suffix_rouge_l"] for r in parted])),
        "top2_gap_quartiles": quartiles(gaps),
        "gap_below_0.1_share": float(np.mean(np.asarray(gaps) < 0.1)),
        "soft_took_greedy_top2_share": float(np.mean([r["soft_is_top2"] for r in parted])),
        "p1_at_divergence_quartiles": quartiles(
            [r["p1"] for r in parted if r.get("p1") is not None]
        ),
        "all_steps_gap_quartiles": quartiles(np.concatenate(all_gaps)),
        "all_steps_gap_below_0.1_share": float(np.mean(np.concatenate(all_gaps) < 0.1)),
        "divergence_at_smallest_gap_so_far_share": float(
            np.mean([r["smallest_so_far"] for r in parted if "smallest_so_far" in r])
        ),
    }


def main() -> dict:
    with open(RECORD) as f:
        record = json.load(f)
    setting = ep.Setting(**{**record["config"]["setting"], "levels": ()})
    level, max_new = record["validation"]["level"], record["validation"]["max_new_tokens"]
    lm = ep.load_lm(setting)
    # The test problems exactly as experiment_pretrained.measure draws and splits them.
    test = problems.draw(level, "test", setting.test_splits * setting.per_split, ep.TEST_SEED)
    rows, per_split, all_gaps = [], [], []
    soft_index = evaluation.STOCHASTIC.index("soft") + 1
    for split in range(setting.test_splits):
        batch = test[split * setting.per_split : (split + 1) * setting.per_split]
        key = jax.random.PRNGKey(ep.SPLIT_KEY + split)
        prompts = lm.prompts(batch)
        greedy = lm.decode(prompts, decoder=DECODERS["greedy"], rng=key, max_new_tokens=max_new)
        soft = lm.decode(prompts, decoder=DECODERS["soft"], rng=jax.random.fold_in(key, soft_index),
                         max_new_tokens=max_new)  # fmt: skip
        g_chains, s_chains = pretrained_eval.chains(greedy)[0], pretrained_eval.chains(soft)[0]
        split_rows = compare(g_chains, s_chains)
        tops = top2_at(lm, prompts, greedy, [r["first"] for r in split_rows])
        # The token soft emitted where it parted (the delimiter when its chain ended first).
        for r, top, s in zip(split_rows, tops, soft["completion_SBN"][0], strict=True):
            if top is not None:
                r |= {"p1": top[0], "p2": top[1], "soft_is_top2": int(s[r["first"]]) == top[3]}
            else:
                r["soft_is_top2"] = False
        gaps = chain_gaps(lm, prompts, greedy)
        for r, g in zip(split_rows, gaps, strict=True):
            if "p1" in r and r["first"] < len(g):
                r["smallest_so_far"] = bool(g[r["first"]] <= g[: r["first"] + 1].min())
        all_gaps += gaps
        recorded = record["rows"][split]["soft/rouge_l_greedy"]
        measured = float(np.mean([r["rouge_l"] for r in split_rows]))
        per_split.append({"split": split, "rouge_l": measured, "recorded": recorded})
        print(f"   split {split}: ROUGE-L soft-greedy {measured:.4f} (record {recorded:.4f})",
              flush=True)  # fmt: skip
        rows += split_rows
    summary = summarize(rows, all_gaps) | {
        "sample_rouge_l_greedy_record": float(
            np.mean([r["sample/rouge_l_greedy"] for r in record["rows"]])
        ),
        "per_split": per_split,
    }
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    main()
    sys.exit(0)
