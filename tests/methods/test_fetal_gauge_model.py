"""The small Fetal-Gauge VLM: option scores equal separate forwards, padded options never win, the
loss reads only the answer's tokens, the tokenizer covers the phantom language, training on an
easy set rises above chance while lr 0 does not, VLMModel pads its last batch and load reads a
training run back."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs import fetal_gauge as fg_config
from core import train
from core.errors import ConfigError
from core.nn import vlm
from methods.fetal_gauge import make, model, records, text
from methods.fetal_gauge.vocab import VOCAB


@functools.lru_cache
def setup():
    config = fg_config.get_config("size=smoke")
    cfg = model.model_config(config)
    return config, cfg, vlm.init_params(cfg, jax.random.key(0))


def _records(n=6, task="PI", seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        image = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
        answer = VOCAB[task][i % len(VOCAB[task])]
        out.append(
            records.build(f"q{i}", image, task, answer, seed=seed, split="test", patient_id=i)
        )
    return out


def test_tokenizer_covers_every_option_text_and_question():
    for texts in (*VOCAB.values(), tuple(records.QUESTIONS.values())):
        for t in texts:
            ids = text.encode(t)
            assert text.UNK not in ids and text.decode(ids).replace(" ", "") == t.lower().replace(
                " ", ""
            )
    assert text.encode("an unknown word") == [text.UNK] * 3  # outside the phantom language


def test_option_scores_equal_one_forward_per_option_and_padding_never_wins():
    config, cfg, params = setup()
    recs = _records(3)
    batch = model.encode_records(recs)
    batch["valid"][1, 3] = False  # question 1 offers three options: the fourth is padding
    scores = np.asarray(model.option_scores(cfg, params, batch))
    images = batch["image"].astype(np.float32) / 127.5 - 1.0
    for b in range(3):
        for k in range(4):
            tokens, mask = batch["tokens"][b, k], batch["score_mask"][b, k]
            logits = vlm.apply(cfg, params, images[b : b + 1], tokens[None]).logits_BTV[0]
            log_p = jax.nn.log_softmax(logits[cfg.num_image_tokens : -1])
            by_hand = float(jnp.sum(log_p[jnp.arange(len(tokens) - 1), tokens[1:]] * mask[:-1]))
            if (b, k) == (1, 3):
                assert scores[b, k] == -np.inf
            else:  # the same numbers through one tiled forward: float32 reassociation only
                np.testing.assert_allclose(scores[b, k], by_hand, rtol=1e-5, atol=1e-4)


def test_score_mask_covers_the_option_and_eos_only():
    tokens, mask = model.encode_row(records.QUESTIONS["VG"], "stomach bubble")
    q = len(text.encode(records.QUESTIONS["VG"]))
    # position t's logits predict token t + 1: the mask marks predictions of the option and EOS
    predicted = tokens[1:][mask[:-1] > 0]
    assert predicted.tolist() == [*text.encode("stomach bubble"), text.EOS]
    assert tokens[q] == text.SEP and mask.sum() == 3
    with pytest.raises(ConfigError, match="at most"):
        model.encode_row("word " * 30, "skull", "long-qid")


def test_the_loss_reads_the_answer_row_only():
    config, cfg, params = setup()
    batch = model.encode_records(_records(4))
    loss = float(model.loss_fn(cfg, params, batch)[0])
    other = dict(batch)
    wrong = (batch["answer"] + 1) % 4  # a distractor row becomes the answer: the loss changes
    assert abs(float(model.loss_fn(cfg, params, {**other, "answer": wrong})[0]) - loss) > 1e-4
    tokens = batch["tokens"].copy()  # a distractor's tokens changed: the loss does not
    for b, a in enumerate(batch["answer"]):
        tokens[b, (a + 1) % 4, 3] = text.UNK
    np.testing.assert_allclose(float(model.loss_fn(cfg, params, {**batch, "tokens": tokens})[0]),
                               loss, rtol=1e-6)  # fmt: skip


def test_training_on_an_easy_set_leaves_chance_and_lr_zero_does_not(tmp_path):
    # VC phantoms of 10 patients, 60 steps of the smoke model on 8 fake devices' first one; the
    # validation accuracy of VC (2 options) from the core's eval_step.
    def final_accuracy(lr):
        config = fg_config.get_config("size=smoke")
        config.train.steps, config.optim.lr = 60, lr
        config.train.checkpoint_every, config.train.eval_every = 0, 0
        config.data.num_patients = 20
        result = train.run(
            config, make(config), str(tmp_path / f"lr{lr}"), devices=jax.devices()[:1]
        )
        return result.history[-1]["eval/accuracy"]

    trained, frozen = final_accuracy(3e-3), final_accuracy(0.0)
    # chance is ~0.3 over the five tasks; lr 0 stays within noise of it, training leaves it
    assert frozen < 0.45 and trained > frozen + 0.15, (trained, frozen)


def test_vlm_model_pads_its_last_batch_and_agrees_with_option_scores():
    config, cfg, params = setup()
    recs = _records(5, "VG")
    batch = model.encode_records(recs)
    direct = np.argmax(np.asarray(model.option_scores(cfg, params, batch)), -1)
    m = model.VLMModel(cfg, params, batch_size=2)  # batches 2 + 2 + 1 (padded)
    scores = m.score_options([r.image for r in recs], [r.question for r in recs],
                             [r.options for r in recs])  # fmt: skip
    assert [len(s) for s in scores] == [len(r.options) for r in recs]
    assert [int(np.argmax(s)) for s in scores] == direct.tolist()


def test_load_reads_a_training_run_back_and_refuses_other_folders(tmp_path):
    config = fg_config.get_config("size=smoke")
    config.train.checkpoint_every = 2
    result = train.run(config, make(config), str(tmp_path / "run"), devices=jax.devices()[:1])
    loaded = model.load(str(tmp_path / "run"))
    for a, b in zip(
        jax.tree.leaves(loaded.params), jax.tree.leaves(result.state.params), strict=True
    ):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ConfigError, match="no .*config.json"):
        model.load(str(tmp_path / "missing"))
