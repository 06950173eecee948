"""methods/vwf_dyslexia stimuli: pseudowords are never dictionary words (and the exclusion has
work to do), rendering and every generator are deterministic per seed, scrambling keeps the ink
and destroys the letters, the task generators draw what their labels say."""

import numpy as np
import pytest
from scipy import ndimage

import methods
from configs import vwf_dyslexia as vwf_config
from core.errors import ConfigError
from methods.vwf_dyslexia import stimuli, tasks


def test_pseudowords_are_never_dictionary_words_and_use_only_seen_bigrams():
    words = stimuli.dictionary()
    fake = stimuli.pseudowords(300, seed=0)
    assert len(set(fake)) == 300 and not set(fake) & words
    assert all(3 <= len(w) <= 7 and set(w) & stimuli.VOWELS for w in fake)
    seen = {a + b for w in stimuli.word_list() for a, b in zip("^" + w, w + "$", strict=True)}
    assert all(a + b in seen for w in fake for a, b in zip("^" + w, w + "$", strict=True))
    assert stimuli.pseudowords(20, seed=0) == fake[:20]
    assert stimuli.pseudowords(20, seed=1) != fake[:20]
    # The exclusion is not vacuous: the raw chain does produce real words.
    chain, rng = stimuli.BigramChain(stimuli.word_list()), np.random.default_rng(0)
    raw = chain.sample(rng, 300, 7)
    assert sum(s in words for s in raw if s) > 10


def test_word_list_comes_from_english_words_within_its_lengths():
    words = stimuli.word_list(3, 5)
    assert len(words) > 5000 and all(3 <= len(w) <= 5 for w in words)
    assert {"cat", "house", "glove"} <= set(words) and set(words) <= stimuli.dictionary()
    with pytest.raises(ValueError, match="min_len <= max_len"):
        stimuli.word_list(5, 3)


@pytest.mark.parametrize("category", stimuli.CATEGORIES)
def test_localiser_images_are_deterministic_per_seed_in_range(category):
    a = stimuli.localiser_images(category, 4, seed=3)
    assert a.shape == (4, 32, 128) and a.dtype == np.float32
    assert a.min() == 0.0 and a.max() == 1.0 and (a > 0).mean() > 0.005  # ink present
    np.testing.assert_array_equal(a, stimuli.localiser_images(category, 4, seed=3))
    assert np.any(a != stimuli.localiser_images(category, 4, seed=4))


def test_scrambled_words_keep_the_words_ink_and_lose_the_letters():
    words = stimuli.localiser_images("word", 5, seed=0)
    scrambled = stimuli.localiser_images("scrambled_word", 5, seed=0)
    for w, s in zip(words, scrambled, strict=True):
        np.testing.assert_array_equal(np.sort(w.ravel()), np.sort(s.ravel()))
        ink_w, ink_s = np.argwhere(w > 0), np.argwhere(s > 0)
        assert np.all(ink_s.min(0) >= ink_w.min(0) // 4 * 4)  # inside the word's tile box
        assert np.all(ink_s.max(0) < (ink_w.max(0) // 4 + 1) * 4)
        assert np.mean(w != s) > 0.02  # the letters' pixels moved


def test_rendering_differs_by_font_and_refuses_text_that_does_not_fit():
    images = [stimuli.render_text("glove", f, np.random.default_rng(0)) for f in stimuli.FONTS]
    assert all(np.any(a != b) for a, b in zip(images, images[1:], strict=False))
    for name in stimuli.HELD_OUT_FONTS:
        assert (stimuli.render_text("glove", name, np.random.default_rng(0)) > 0).any()
    with pytest.raises(ValueError, match="does not fit"):
        stimuli.render_text("x" * 40, stimuli.FONTS[0], np.random.default_rng(0))
    with pytest.raises(ValueError, match="not found"):
        stimuli.font("OpenDyslexic.ttf", 12)


def test_shape_comparison_draws_the_counts_its_label_compares():
    rng = np.random.default_rng(0)
    labels = []
    for _ in range(20):
        image, label, (circles, squares) = stimuli.shape_comparison(rng)
        # Shapes never touch, so each is one 8-connected component of ink.
        _, components = ndimage.label(image > 0, structure=np.ones((3, 3)))
        assert components == circles + squares and circles != squares
        assert label == int(circles > squares)
        labels.append(label)
    assert 0 < sum(labels) < 20


def test_sentence_picture_is_deterministic_balanced_and_well_formed():
    draws = [stimuli.sentence_picture(np.random.default_rng(k)) for k in range(60)]
    again = stimuli.sentence_picture(np.random.default_rng(5))
    np.testing.assert_array_equal(again[0], draws[5][0])
    assert again[1:] == draws[5][1:]
    labels = [label for _, _, label in draws]
    assert 15 < sum(labels) < 45
    for _, sentence, _ in draws:
        x, relation, y = sentence.split(" ", 1)[0], sentence.split()[1], sentence.split()[-1]
        assert x in stimuli.SHAPES and y in stimuli.SHAPES and x != y
        assert relation in ("left", "right")


def test_task_text_masks_exactly_the_answer_tokens():
    out = tasks.encode("sentence", [tasks.YES], "circle left of square")
    assert out["inputs"].shape == out["targets"].shape == (tasks.TEXT_LEN,)
    np.testing.assert_array_equal(out["inputs"][1:], out["targets"][:-1])  # shifted by one
    (answer_at,) = np.nonzero(out["mask"])
    assert out["targets"][answer_at].tolist() == [tasks.YES]
    assert out["inputs"][answer_at].tolist() == [tasks.QUERY]  # predicted after the query
    letters = tasks.encode("letters", [tasks.TOKEN["g"], tasks.TOKEN["e"]])
    assert letters["targets"][letters["mask"] > 0].tolist() == [tasks.TOKEN["g"], tasks.TOKEN["e"]]
    with pytest.raises(ValueError, match="longer than"):
        tasks.encode("sentence", [tasks.YES], "circle left of square of")
    with pytest.raises(ValueError, match="not in"):
        tasks.encode("sentence", [tasks.YES], "circle above square")


def test_val_and_eval_letter_strings_are_never_trained_on_nor_shared():
    splits = {name: tasks.letter_strings(name) for name in tasks.SPLITS}
    for a, b in (("train", "val"), ("train", "eval"), ("val", "eval")):
        assert not set(splits[a].words) & set(splits[b].words)
        assert not set(splits[a].pseudowords) & set(splits[b].pseudowords)
    for name in ("val", "eval"):  # 5 % of the strings each
        assert 0.03 < len(splits[name].words) / len(splits["train"].words) < 0.08
        assert len(splits[name].pseudowords) > 500
    ex = tasks.example(np.random.default_rng(0), splits["eval"])
    assert ex["image"].shape == (32, 128, 1) and ex["task"] in range(len(tasks.TASKS))
    with pytest.raises(ValueError, match="unknown split 'test'"):
        tasks.in_split("cat", "test")


def test_jitter_zero_draws_every_string_at_one_size_and_place():
    def render(rng_seed, jitter, text="glove"):
        return stimuli.render_text(text, stimuli.FONTS[0], np.random.default_rng(rng_seed), jitter)

    np.testing.assert_array_equal(render(0, 0.0), render(1, 0.0))
    assert np.any(render(0, 1.0) != render(1, 1.0))
    assert np.any(render(0, 0.5) != render(1, 0.5))
    for text in ("cat", "glove", "jumping"):  # left-aligned at the 2-pixel margin
        columns = np.flatnonzero(render(0, 0.0, text).any(0))
        assert 2 <= columns[0] <= 3
    with pytest.raises(ValueError, match=r"jitter must be in \[0, 1\]"):
        render(0, 1.5)


def test_curriculum_schedules_jitter_and_adds_lexical_decision_late():
    c = tasks.Curriculum(jitter_from=100, jitter_to=300, lexical_from=200)
    assert [c.jitter_at(s) for s in (0, 100, 200, 299, 300, 5000)] == [0, 0, 0.5, 0.995, 1, 1]
    assert "lexical" not in c.tasks(199) and c.tasks(200) == tasks.TASKS
    strings = tasks.letter_strings("train", 8)
    early = [tasks.curriculum_example(np.random.default_rng(i), 0, strings, c) for i in range(40)]
    assert tasks.TASKS.index("lexical") not in {int(e["task"]) for e in early}
    plain = tasks.Curriculum()  # all zeros: the plain stream, draw for draw
    for i in range(8):
        got = tasks.curriculum_example(np.random.default_rng(i), 0, strings, plain)
        want = tasks.example(np.random.default_rng(i), strings)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key])
    with pytest.raises(ConfigError, match="jitter_from <= jitter_to"):
        tasks.Curriculum(jitter_from=5, jitter_to=2)


def test_eval_sets_ask_lexical_decision_about_the_trained_lexicon():
    from methods.vwf_dyslexia import lesion

    got = lesion.eval_set(6, seed=2, lexicon_size=8, task_names=("lexical",), split="val")
    rng, strings = np.random.default_rng([2, 0]), tasks.letter_strings("val", 8)
    want = [tasks.task_example(rng, "lexical", strings) for _ in range(6)]
    np.testing.assert_array_equal(got["image"], np.stack([w["image"] for w in want]))
    assert set(strings.known) == set(tasks.lexicon(8))


def test_an_eval_set_that_is_not_whole_batches_is_refused():
    config = vwf_config.get_config("size=smoke")
    config.eval.num_examples = config.train.batch_size + 4  # would drop 4 examples silently
    with pytest.raises(ConfigError, match="multiple of train.batch_size"):
        methods.make(config)


def test_blank_patches_embed_to_their_position_alone():
    # Background 0: the ViT's bias-free patch embedding sends a blank patch to 0, so a token
    # carries ink and position only. With background -1 every token held a shared -W 1 as large
    # as the ink's signal, and the cpu size sat at its task priors (README's table).
    import jax

    from core.nn import dit, vit

    image = stimuli.render_text("cat", stimuli.FONTS[0], np.random.default_rng(0))
    cfg = methods.vwf_dyslexia.model_config(vwf_config.get_config("size=cpu")).vit
    params = vit.init_params(cfg, jax.random.key(0))
    _, captured = vit.forward(cfg, params, image[None, :, :, None], capture=("embed",))
    blank_N = ~dit.patchify(image[None, :, :, None] > 0, cfg.patch_size)[0].any(-1)
    assert 0 < blank_N.sum() < cfg.num_tokens  # the word leaves some patches blank
    table_ND = dit.sincos_positions(*cfg.grid[:1], cfg.d_model, grid_cols=cfg.grid[1])
    np.testing.assert_array_equal(captured["embed"][0][blank_N], table_ND[blank_N])
