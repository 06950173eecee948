"""The chain-divergence diagnosis (`chain_divergence`): the first divergence of hand-made chains,
and on the tiny tied GQA Llama of the pretrained tests, that greedy and vanilla soft chains agree
exactly before it and that greedy's top-1 token there is greedy's own token."""

import jax
import numpy as np

from methods.soft_thinking import chain_divergence as cd
from methods.soft_thinking import pretrained_eval, problems
from methods.soft_thinking.evaluation import DECODERS
from tests.methods.test_soft_thinking_pretrained import tiny_lm


def test_first_divergence_of_hand_made_chains():
    assert cd.first_divergence([5, 6, 7], [5, 6, 7]) == -1  # equal
    assert cd.first_divergence([], []) == -1
    assert cd.first_divergence([5, 6, 7, 8], [5, 6, 9, 8]) == 2
    assert cd.first_divergence([1, 6], [5, 6]) == 0
    assert cd.first_divergence([5, 6], [5, 6, 7]) == 2  # one chain ends first: it parts there
    assert cd.first_divergence([5, 6, 7], [5]) == 1
    rows = cd.compare([np.array([1, 2, 3, 4])], [np.array([1, 2, 9, 4])])
    assert rows[0]["first"] == 2 and not rows[0]["equal"]
    # Suffixes [3, 4] and [9, 4]: LCS 1 of length 2.
    assert rows[0]["suffix_rouge_l"] == 0.5


def test_divergence_on_tiny_model_decodes():
    lm = tiny_lm()
    batch = problems.draw("add_1d", "test", 6, seed=0)
    prompts = lm.prompts(batch)
    key = jax.random.key(0)
    greedy = lm.decode(prompts, decoder=DECODERS["greedy"], rng=key, max_new_tokens=16)
    soft = lm.decode(prompts, decoder=DECODERS["soft"], rng=key, max_new_tokens=16)
    g_chains, s_chains = pretrained_eval.chains(greedy)[0], pretrained_eval.chains(soft)[0]
    rows = cd.compare(g_chains, s_chains)
    for r, g, s in zip(rows, g_chains, s_chains, strict=True):
        if r["equal"]:
            np.testing.assert_array_equal(g, s)
            continue
        d = r["first"]
        np.testing.assert_array_equal(g[:d], s[:d])  # identical before it
        assert d == min(len(g), len(s)) or g[d] != s[d]  # different at it
    steps = [len(g) // 2 for g in g_chains]
    tops = cd.top2_at(lm, prompts, greedy, steps)
    gaps = cd.chain_gaps(lm, prompts, greedy)
    for b, (top, d) in enumerate(zip(tops, steps, strict=True)):
        if top is None:
            continue
        p1, p2, first_id, _ = top
        # Greedy emits the argmax: the top-1 at step d is greedy's own token d.
        assert first_id == int(greedy["completion_SBN"][0, b, d])
        assert p1 >= p2
        if d < len(gaps[b]):
            # The same step read from the whole chain's forward pass: float32 rounding only.
            np.testing.assert_allclose(gaps[b][d], p1 - p2, atol=1e-5)
