"""methods/vwf_dyslexia localiser, lesions and lexical decision: Welch t against SciPy, global
and per-layer top-k, layer-matched random controls, per-unit means over every position, the
vmapped lesion evaluation against one mask at a time, and lexical decision on any word list."""

import functools

import jax
import numpy as np
import pytest
from scipy import stats as scipy_stats

from configs import vwf_dyslexia as vwf_config
from core.nn import vlm
from methods.vwf_dyslexia import lesion, lexical, localiser, model_config, task_accuracy, tasks

CONFIG = vwf_config.get_config("size=smoke")
CONFIG.model.update(patch_size=16, num_layers=2)  # 16 image tokens, two layers to rank over
CFG = model_config(CONFIG)
L, F = CFG.decoder.num_layers, CFG.decoder.d_ff


@functools.cache
def params():
    return vlm.init_params(CFG, jax.random.key(0))


def test_welch_t_equals_scipy_and_is_zero_for_constant_units():
    rng = np.random.default_rng(0)
    a = rng.normal(0.3, 1.0, size=(12, 50))
    b = rng.normal(0.0, 3.0, size=(30, 50))  # unequal variances and sizes: Welch != Student
    a[:, 7] = b[:, 7] = 2.0  # no variance in either group: t undefined -> 0
    t = localiser.welch_t(a, b)
    expected = scipy_stats.ttest_ind(a, b, equal_var=False).statistic
    keep = np.arange(50) != 7
    # float64 on both sides; 1e-10 leaves room for summation order only
    np.testing.assert_allclose(t[keep], expected[keep], rtol=1e-10)
    assert t[7] == 0.0
    student = scipy_stats.ttest_ind(a, b, equal_var=True).statistic
    assert np.max(np.abs(t[keep] - student[keep])) > 0.1  # the test can tell the two apart


def test_global_and_per_layer_top_k_select_what_they_say():
    t_LF = np.zeros((3, 100))
    t_LF[1] = np.arange(100) + 1000.0  # layer 1 holds every large t
    t_LF[0] = np.arange(100)
    t_LF[2] = -np.arange(100)
    glob = localiser.top_k_global(t_LF, 10)  # 30 units of 300
    assert glob.sum() == 30 and glob[1].sum() == 30 and glob[1, 70:].all()
    per = localiser.top_k_per_layer(t_LF, 10)
    assert per.sum(axis=1).tolist() == [10, 10, 10]
    assert per[0, 90:].all() and per[2, :10].all()
    assert localiser.top_k_global(t_LF, 0.1).sum() == 1  # never an empty selection
    with pytest.raises(ValueError, match="must be in"):
        localiser.top_k_global(t_LF, 0)


def test_random_controls_match_count_and_layer_histogram():
    selected = localiser.top_k_global(np.random.default_rng(0).normal(size=(4, 200)) ** 3, 5)
    selected[0] = False  # an uneven histogram: none in layer 0
    controls = [localiser.random_matched(selected, np.random.default_rng(s)) for s in range(5)]
    for control in controls:
        np.testing.assert_array_equal(control.sum(axis=1), selected.sum(axis=1))
        assert localiser.overlap(control, selected) < 0.5  # random, not the selection again
    assert localiser.mean_pairwise_overlap(controls) < 0.5
    assert localiser.mean_pairwise_overlap([selected, selected]) == 1.0
    with pytest.raises(ValueError, match="different sizes"):
        localiser.overlap(selected, ~selected)


def test_unit_means_average_every_position_and_pad_the_last_batch():
    images = np.random.default_rng(1).uniform(-1, 1, size=(5, 32, 128)).astype(np.float32)
    means = localiser.unit_means(CFG, params(), images, batch_size=4)  # 4 + 1 (padded)
    assert means.shape == (5, L, F)
    tokens = np.broadcast_to(localiser.prompt_tokens(), (5, len(localiser.PROMPT)))
    apply = jax.jit(vlm.apply, static_argnums=0, static_argnames="capture")
    out = apply(CFG, params(), images[..., None], tokens, capture=vlm.gate_names(CFG))
    for layer, name in enumerate(vlm.gate_names(CFG)):
        gate_BTF = np.asarray(out.captured[name])
        assert gate_BTF.shape[1] == CFG.num_image_tokens + len(localiser.PROMPT)
        # float32, different batch shapes: reassociation only
        np.testing.assert_allclose(means[:, layer], gate_BTF.mean(axis=1), rtol=1e-4, atol=1e-5)


def test_t_map_resamples_are_deterministic_and_differ_by_seed():
    a = localiser.t_map(CFG, params(), 4, seed=0, batch_size=4)
    assert a.shape == (L, F) and np.all(np.isfinite(a)) and np.any(a != 0)
    np.testing.assert_array_equal(a, localiser.t_map(CFG, params(), 4, seed=0, batch_size=4))
    assert np.any(a != localiser.t_map(CFG, params(), 4, seed=1, batch_size=4))


def masks():
    rng = np.random.default_rng(2)
    zeroed = lesion.unit_masks(rng.random((2, L, F)) < 0.3)
    scaled = lesion.unit_masks(rng.random((1, L, F)) < 0.3, value=-2.0)
    return np.concatenate([np.ones((1, L, F), np.float32), zeroed, scaled])


def test_vmapped_lesions_equal_each_mask_alone_and_padding_never_counts():
    examples = lesion.eval_set(3, seed=0, lexicon_size=0)  # 12, batches of 8: one padded
    assert examples["task"].tolist() == [0] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    m = masks()
    together = lesion.accuracy(CFG, params(), examples, m, batch_size=8)
    one_by_one = lesion.accuracy(CFG, params(), examples, m, batch_size=8, chunk=3)  # padded
    for task in tasks.TASKS:
        assert together[task].shape == (4,)
        np.testing.assert_array_equal(together[task], one_by_one[task])
    batch = {**examples, "valid": np.ones(12, np.float32)}
    score = jax.jit(task_accuracy, static_argnums=0)
    for i, mask_LF in enumerate(m):  # the training evaluation's scoring, mask by mask
        counts = score(CFG, params(), batch, mask_LF)
        for task in tasks.TASKS:
            right, total = (float(x) for x in counts[f"accuracy/{task}"])
            assert total == 3 and together[task][i] == right / total


def test_lesion_masks_put_the_value_on_selected_units_only():
    selected = np.zeros((2, L, F), bool)
    selected[0, 0, 3] = selected[1, L - 1, 0] = True
    m = lesion.unit_masks(selected, value=0.5)
    assert m.dtype == np.float32 and np.sum(m != 1) == 2
    assert m[0, 0, 3] == 0.5 and m[1, L - 1, 0] == 0.5


def test_lexical_decision_reads_any_list_and_agrees_with_the_lesion_evaluation(tmp_path):
    path = tmp_path / "items.txt"
    path.write_text("# a list\nglove 1\ngolve pseudo\n\nhouse real\nblick 0\n")
    pairs = lexical.read_pairs(str(path))
    assert pairs == [("glove", True), ("golve", False), ("house", True), ("blick", False)]
    m = masks()[1]
    out = lexical.decide(CFG, params(), pairs, seed=3, gate_mask_LF=m, batch_size=3)
    assert [i["string"] for i in out["items"]] == ["glove", "golve", "house", "blick"]
    examples = lesion.stack(
        [
            tasks.lexical_example(w, r, lexical.stimuli.FONTS[0], np.random.default_rng([3, i]))
            for i, (w, r) in enumerate(pairs)
        ]
    )
    four = np.stack([m] * 4)  # the shapes compiled above: (4 masks, batches of 8)
    expected = lesion.accuracy(CFG, params(), examples, four, batch_size=8)["lexical"][0]
    assert out["accuracy"] == expected
    bad = tmp_path / "bad.txt"
    bad.write_text("glove 1\nhouse maybe\n")
    with pytest.raises(ValueError, match=r"bad.txt:2: expected"):
        lexical.read_pairs(str(bad))
    with pytest.raises(ValueError, match="lowercase a-z"):
        lexical.decide(CFG, params(), [("Glove", True)])
