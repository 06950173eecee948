"""TTE's plain-text part: the pair groups (no validation or test pair reaches training), traces
around an answer, the evaluation queries, the LM reasoner's parsing, its prompt choice on training
pairs only, batch-independent greedy replies and the cached answer table (a tiny chat LM stands
in for SmolLM2), and one smoke unit of each text arm."""

import jax
import numpy as np
import pytest
from ml_collections import ConfigDict

from configs import tte as tte_config
from core.errors import ConfigError
from core.nn import transformer
from methods.tte import examples, lm_traces, runs, tasks, text
from tests.fixtures.tiny_chat_lm import CFG, CharTokenizer


def decoded_pair(tokens) -> tuple[str, tuple[int, int]]:
    """(family, digits) read back from a text query's tokens (its instruction)."""
    words = tasks.decode(tokens)
    if words[1] == "larger":
        return "text_larger", (int(words[3]), int(words[4]))
    family = {"plus": "text_plus", "minus": "text_minus"}[words[2]]
    return family, (int(words[1]), int(words[3]))


def test_groups_partition_each_family_and_keep_both_orders_together():
    for family in tasks.TEXT_FAMILIES:
        groups = {name: set(text.pairs_in(family, name)) for name in text.GROUPS}
        assert set().union(*groups.values()) == set(text.pairs(family))
        assert sum(map(len, groups.values())) == len(text.pairs(family))
        assert all(groups.values()), f"{family}: an empty group"
    for x, y in text.pairs("text_larger"):
        assert text.group("text_larger", (x, y)) == text.group("text_larger", (y, x))


def test_training_pairs_never_ask_about_validation_or_test_pairs():
    rng, s = np.random.default_rng(0), tasks.split("train")
    fmt = examples.QueryFormat(style="full", families="text").check()
    seen = set()
    for _ in range(1500):
        ex = text.pair(rng, s, fmt)
        family, d = decoded_pair(ex["q_tokens"])
        assert text.group(family, d) == "train"
        assert ex["label"] == text.answer(family, d)
        seen.add((family, d))
    # every training pair comes up: the embedder sees the whole training table
    assert len(seen) == sum(len(text.pairs_in(f, "train")) for f in tasks.TEXT_FAMILIES)


def test_traces_are_written_around_the_given_answer():
    assert text.trace_words("text_plus", (4, 3), 7, "full") == [
        "<think>", "4", "+", "3", "=", "7", "</think>", "seven",
    ]  # fmt: skip
    assert text.trace_words("text_larger", (3, 8), 8, "final") == ["eight"]
    wrong = text.trace_words("text_minus", (7, 3), 5, "full")  # an LM's wrong answer, kept
    assert wrong[-1] == "five" and wrong[5] == "5"
    for missing in (None, 12, -1):
        assert text.trace_words("text_plus", (9, 3), missing, "full") == []
    assert text.trace_words("text_plus", (4, 3), 7, "none") == []


def test_eval_queries_ask_only_their_group_with_right_positives():
    s = tasks.split("test")
    g = examples.gallery(s)
    for family in tasks.TEXT_FAMILIES:
        q = text.eval_queries(s, family, "test", 40, seed=2)
        assert {text.group(family, text.digits(d)) for d in q.shown} == {"test"}
        assert np.array_equal(q.answer, text.answers(q))
        assert np.all(g.label[q.positive] == q.answer)
        assert np.all(g.label[q.negatives] != q.answer[:, None])
        again = text.eval_queries(s, family, "test", 40, seed=2)
        assert np.array_equal(q.positive, again.positive)


def test_bad_families_and_groups_name_the_problem():
    with pytest.raises(ConfigError, match="families='texts' is unknown"):
        tte_config.get_config("families=texts")
    with pytest.raises(ConfigError, match="families='texts'"):
        examples.QueryFormat(families="texts").check()
    with pytest.raises(ConfigError, match="trace_only"):
        examples.QueryFormat(style="full", trace_only=True, families="text").check()
    with pytest.raises(ConfigError, match="pair group 'seen'"):
        text.pairs_in("text_plus", "seen")
    with pytest.raises(ConfigError, match="text family 'text_times'"):
        text.pairs("text_times")


@pytest.mark.parametrize(
    "reply, marker, expected",
    [
        ("First 4 + 3 = 7.\nSo, the answer is 7.", "answer", 7),
        ("The answer is 12 and 3.", "answer", 12),
        ("4 + 3 = 7, then 7.", "answer", None),  # no marker: no answer
        ("The answer is:\n7", "answer", None),  # not on the marker's line
        ("Answer: -2", "answer", -2),
        ("7", None, 7),
        ("It is 8. Or 9.", None, 8),
        ("seven", None, None),
    ],
)
def test_parse(reply, marker, expected):
    assert lm_traces.parse(reply, marker) == expected


def raw_answers(right_on) -> dict:
    """A raw decode result whose answers are right exactly on the pairs `right_on` accepts."""
    asked = lm_traces.questions()
    out = {}
    for name in lm_traces.PROMPTS:
        answers = [text.answer(f, d) if right_on(name, f, d) else None for f, d in asked]
        out[name] = {"answers": answers, "replies": [""] * len(asked)}
    return out


def test_the_prompt_is_chosen_on_training_pairs_only():
    # cot: right on every validation and test pair and every other training pair (more right
    # overall); direct: right on every training pair. Training accuracy must choose direct.
    train = {(f, d) for f in tasks.TEXT_FAMILIES for d in text.pairs_in(f, "train")}
    every_other = set(sorted(train)[::2])

    def right_on(name, f, d):
        if name == "direct":
            return (f, d) in train
        return (f, d) not in train or (f, d) in every_other

    raw = raw_answers(right_on)
    table = lm_traces._as_table(raw)
    acc = table["accuracy"]
    overall = {
        name: np.mean([a is not None for a in raw[name]["answers"]]) for name in lm_traces.PROMPTS
    }
    assert overall["cot"] > overall["direct"]  # the planted trap: overall would choose cot
    assert acc["direct"]["train"] == 1.0 and acc["cot"]["test"] == 1.0
    assert table["prompt"] == "direct"
    assert table["answers"]["text_plus"][(4, 3)] == (7 if ("text_plus", (4, 3)) in train else None)


def tiny_reasoner(seed=0):
    params = transformer.init_params(CFG, jax.random.key(seed))
    params["embed"]["embedding"] = params["embed"]["embedding"] * 4.0  # peaked: eos comes up
    return lm_traces.Reasoner(CFG, params, CharTokenizer())


def test_replies_do_not_depend_on_batching(monkeypatch):
    lm = tiny_reasoner()
    questions = [text.question(f, d) for f, d in lm_traces.questions()[:7]]
    prompt = lm_traces.Prompt("Answer.", 6, None)
    monkeypatch.setattr(lm_traces, "BATCH", 4)  # two calls, the second padded
    split = lm_traces.replies(lm, questions, prompt)
    monkeypatch.setattr(lm_traces, "BATCH", 8)
    whole = lm_traces.replies(lm, questions, prompt)
    assert split == whole and len(whole) == 7
    one = lm_traces.replies(lm, questions[5:6], prompt)  # a row alone: its own left padding
    assert one == whole[5:6]


def test_the_answer_table_is_decoded_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(
        lm_traces,
        "PROMPTS",
        {
            "cot": lm_traces.Prompt("Think.", 4, "answer"),
            "direct": lm_traces.Prompt("Go.", 3, None),
        },
    )
    calls = []

    def load():
        calls.append(1)
        return tiny_reasoner()

    first = lm_traces.answer_table(str(tmp_path), load)
    second = lm_traces.answer_table(str(tmp_path), load)
    assert len(calls) == 1 and first == second
    assert set(first["answers"]) == set(tasks.TEXT_FAMILIES)
    assert len(first["answers"]["text_larger"]) == len(text.pairs("text_larger"))


@pytest.mark.parametrize(
    "arm",
    [pytest.param(a, marks=() if a == "tte_lm_text" else pytest.mark.slow) for a in runs.TEXT_ARMS],
)
def test_a_smoke_unit_of_each_text_arm(arm, tmp_path, monkeypatch):
    monkeypatch.setattr(
        lm_traces, "PROMPTS", {"cot": lm_traces.Prompt("Think.", 4, "answer"),
                               "direct": lm_traces.Prompt("Go.", 3, None)},
    )  # fmt: skip
    monkeypatch.setattr(lm_traces, "load", tiny_reasoner)
    c = runs.role_config("smoke", 0, 1e-3, "embedder")
    c.exp = ConfigDict(dict(arm=arm, size="smoke", queries=4))
    row = runs.run(c, str(tmp_path / "runs" / "x"))
    for split in ("validation", "test"):
        for tag in ("unseen", "seen"):
            assert 0.0 <= row[f"{split}/{tag}/p1/mean"] <= 1.0
    assert ("lm_accuracy/test" in row) == (arm == "tte_lm_text")
