"""The TPC datasets (methods/tpc/data.py and prompt_set.py): digits splits and the templated
harmful-prompt set.

Everything but the last test runs without the MiniLM files: the prompts' template logic is
checked on `prompt_set.prompt_texts`, the activation path and its cache on a tiny random MiniLM.
The last test encodes ~50 prompts with the real model and skips, saying why, when its files cannot
be found (MINILM_REQUIRED=1 makes that a failure), like tests/methods/test_minilm.py.
"""

import os

import numpy as np
import pytest
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import f1_score

from core.errors import ConfigError
from methods.tpc import data, minilm, minilm_files, prompt_set
from tests.methods.test_minilm import tiny_model

# --- digits ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits():
    return data.load("digits", seed=0)


def test_digits_shapes_and_parity_labels(digits):
    x_ND, digit_N = load_digits(return_X_y=True)
    parts = data.digits_indices(0)
    assert sum(len(v) for v in parts.values()) == len(digit_N) == 1797
    assert len(np.unique(np.concatenate(list(parts.values())))) == 1797  # a partition
    assert (len(parts["test"]), len(parts["val"])) == (540, 252)  # 30 %, then 20 % of train
    for name in ("train", "val", "test"):
        x, y = getattr(digits, f"x_{name}"), getattr(digits, f"y_{name}")
        assert x.shape == (len(parts[name]), 64) and x.dtype == np.float32
        assert y.dtype == np.int32
        np.testing.assert_array_equal(y, digit_N[parts[name]] % 2)  # 1 = odd digit
    assert digits.info["sizes"] == {"train": 1005, "val": 252, "test": 540}


def test_digits_standardised_by_train_statistics(digits):
    x_ND = load_digits().data
    parts = data.digits_indices(0)
    train = x_ND[parts["train"]]
    mean_D, std_D = train.mean(0), train.std(0)
    varying = std_D > data.STD_FLOOR
    assert (~varying).sum() >= 1  # digits has always-blank pixels: the zero-variance rule matters
    np.testing.assert_allclose(digits.x_train.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(digits.x_train.std(0)[varying], 1, atol=1e-5)
    scale_D = np.where(varying, std_D, 1.0)  # constant features are only centred
    for name in ("val", "test"):
        want = (x_ND[parts[name]] - mean_D) / scale_D  # train's statistics, not their own
        np.testing.assert_allclose(getattr(digits, f"x_{name}"), want, rtol=1e-5, atol=1e-5)
    assert np.abs(digits.x_test).max() < 100  # no 1/1e-6 blow-up of train-constant pixels


def test_digits_seeded_and_stratified(digits):
    again, other = data.load("digits", seed=0), data.load("digits", seed=1)
    for a, b in zip(digits[:6], again[:6], strict=True):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(digits.y_test, other.y_test)
    assert not np.array_equal(digits.x_train[:50], other.x_train[:50])
    for splits in (digits, other):
        rates = [splits.y_train.mean(), splits.y_val.mean(), splits.y_test.mean()]
        assert max(rates) - min(rates) < 0.01, rates  # stratified by the digit: 0.5 +- noise
        assert 0.49 < rates[0] < 0.52


def test_errors_are_one_line_and_name_the_choices():
    with pytest.raises(ConfigError, match=r"unknown dataset 'mnist'; choices: digits, prompts"):
        data.load("mnist")
    with pytest.raises(ConfigError, match=r"\['layer'\] for 'digits'; allowed: none") as e:
        data.load("digits", layer=3)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=r"\['size'\].*allowed: layer, cache_dir"):
        data.load("prompts", size=10)
    with pytest.raises(ConfigError, match="seed=-1"):
        data.load("digits", seed=-1)
    with pytest.raises(ConfigError, match="limit=2"):
        data.load("prompts", limit=2)


# --- prompts: the texts, without MiniLM ------------------------------------------------------


@pytest.fixture(scope="module")
def prompts():
    return prompt_set.prompt_texts(0)


def parse(text: str):
    """(template id, promote, event id) read back from a text, independently of the generator:
    the template by its fixed prefix and suffix, the direction by the action's first word, the
    event by its (subject, rest) phrase."""
    (t,) = [
        i
        for i, tpl in enumerate(prompt_set.TEMPLATES)
        if text.startswith(tpl.split("{a}")[0]) and text.endswith(tpl.split("{a}")[1])
    ]
    head, tail = prompt_set.TEMPLATES[t].split("{a}")
    action = text[len(head) : len(text) - len(tail)]
    verb = action.split()[0]
    assert verb in {"make", "cause", "get", "stop", "prevent", "keep"}, action
    promote = verb in {"make", "cause", "get"}
    events = [
        e
        for e, variants in enumerate(prompt_set.EVENTS)
        for s, base in variants
        if f" {s} " in f" {action} " and (base in action or prompt_set.gerund(base) in action)
    ]
    assert len(set(events)) == 1, (action, events)
    return t, promote, events[0]


def test_label_is_operational_and_harmful_action(prompts):
    for i, text in enumerate(prompts.texts):
        t, promote, e = parse(text)
        hazard = e < len(prompt_set.HAZARDS)
        operational = t < len(prompt_set.OPERATIONAL)
        want = operational and ((hazard and promote) or (not hazard and not promote))
        assert prompts.labels[i] == int(want), text
        got = (prompts.template[i], prompts.promote[i], prompts.event[i])
        assert got == (t, promote, e), text
        assert (prompts.hazard[i], prompts.operational[i]) == (hazard, operational), text
    # The truth table: both dangerous actions count only when asked for operationally.
    rule = prompt_set.harmful
    assert [rule(h, p, 1) for h, p in ((1, 1), (0, 0), (1, 0), (0, 1))] == [1, 1, 0, 0]
    assert [rule(h, p, 0) for h, p in ((1, 1), (0, 0))] == [0, 0]


def test_every_factor_cell_is_populated_in_every_split(prompts):
    for name in ("train", "val", "test"):
        m = prompts.split == name
        cells = {(h, p, o) for h, p, o in zip(*(f[m] for f in prompts[3:6]), strict=True)}
        assert len(cells) == 8, name
        rate = prompts.labels[m].mean()
        assert 0.2 <= rate <= 0.5, (name, rate)


def test_splits_hold_out_templates(prompts):
    split, template = prompts.split, prompts.template
    test_t, val_t, train_t = (set(template[split == k].tolist()) for k in ("test", "val", "train"))
    assert test_t == set(prompt_set.held_out_templates(0).tolist())
    assert val_t == set(prompt_set.held_out_templates(0, "val").tolist())
    operational = set(range(len(prompt_set.OPERATIONAL)))
    per_intent = prompt_set.TEST_TEMPLATES_PER_INTENT, prompt_set.VAL_TEMPLATES_PER_INTENT
    assert len(test_t & operational) == len(test_t - operational) == per_intent[0]
    assert len(val_t & operational) == len(val_t - operational) == per_intent[1]
    # Unseen templates at validation and at test time, and not the same ones.
    assert not test_t & val_t and not (test_t | val_t) & train_t
    assert len(train_t) == len(prompt_set.TEMPLATES) - len(test_t) - len(val_t)
    assert len(set(prompts.texts)) == len(prompts.texts)  # no text in two splits (or twice)
    sizes = [int((split == k).sum()) for k in ("train", "val", "test")]
    assert sizes == [1920, 384, 768]


def test_prompts_are_deterministic_per_seed(prompts):
    again, other = prompt_set.prompt_texts(0), prompt_set.prompt_texts(1)
    assert again.texts == prompts.texts
    for a, b in zip(again[1:], prompts[1:], strict=True):
        np.testing.assert_array_equal(a, b)
    assert other.texts != prompts.texts
    assert len(other.texts) == len(prompts.texts)
    assert set(other.texts) != set(prompts.texts)  # other surface variants and held-out sets
    for seed in (1, 2, 3):
        p = prompt_set.prompt_texts(seed)
        for name in ("train", "val", "test"):
            assert 0.2 <= p.labels[p.split == name].mean() <= 0.5, (seed, name)


def test_gerund():
    assert prompt_set.gerund("take a fatal dose") == "taking a fatal dose"
    assert prompt_set.gerund("stop the car") == "stopping the car"
    assert prompt_set.gerund("go off") == "going off"
    assert prompt_set.gerund("deploy") == "deploying"


def test_label_needs_the_interaction_of_the_factors(prompts):
    """A logistic regression on the factor indicators (no products) cannot fit the label; one
    product feature, direction x polarity, makes it exact. The AND of topic and intent that a
    simpler design would use is linearly separable in the same indicators (why the XOR)."""
    ind = np.stack([prompts.operational, prompts.promote, prompts.hazard], 1).astype(float)
    y = prompts.labels

    def f1(features, labels):
        clf = LogisticRegression(C=1e4, max_iter=10_000).fit(features, labels)
        return f1_score(labels, clf.predict(features))

    product = (prompts.promote * prompts.hazard)[:, None]
    additive, with_product = f1(ind, y), f1(np.concatenate([ind, product], 1), y)
    assert with_product == 1.0
    assert additive < 0.8, additive  # best threshold of a sum: 2/3 (one positive cell missed)
    dangerous_and_operational = prompts.operational * prompts.hazard
    assert f1(ind, dangerous_and_operational) == 1.0


# --- prompts: activations --------------------------------------------------------------------


@pytest.fixture
def tiny(monkeypatch):
    """minilm.load() returns a 2-layer random MiniLM; calls of minilm._compute are counted."""
    model, calls = tiny_model(), []
    compute = minilm._compute
    monkeypatch.setattr(minilm, "load", lambda *a, **k: model)
    monkeypatch.setattr(minilm, "_compute", lambda *a: calls.append(len(a[0])) or compute(*a))
    return calls


def test_prompts_activations_split_and_cached(tmp_path, tiny):
    first = data.load("prompts", seed=0, layer=2, limit=40, cache_dir=tmp_path, batch_size=16)
    assert tiny == [40] and (tmp_path / "prompts_l2_s0_n40.npy").is_file()
    again = data.load("prompts", seed=0, layer=2, limit=40, cache_dir=tmp_path, batch_size=16)
    assert tiny == [40]  # read back from the cache, not encoded again
    for a, b in zip(first[:6], again[:6], strict=True):
        np.testing.assert_array_equal(a, b)
    sizes = first.info["sizes"]
    assert sum(sizes.values()) == 40 and min(sizes.values()) >= 1
    assert first.x_train.shape == (sizes["train"], 8) and first.x_val.dtype == np.float32
    np.testing.assert_allclose(first.x_train.mean(0), 0, atol=1e-5)
    # The subset's rows are the full set's rows, labels included.
    full = prompt_set.prompt_texts(0)
    sub = prompt_set.subset(full, 40, 0)
    assert set(sub.texts) <= set(full.texts)
    np.testing.assert_array_equal(first.y_train, sub.labels[sub.split == "train"])
    assert first.info["layer"] == 2
    assert first.info["test_templates"] == [0, 7, 10, 11, 17, 21, 27, 30]
    assert first.info["val_templates"] == [1, 4, 22, 31]


def test_cache_folder_from_environment(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("TPC_CACHE", str(tmp_path / "env"))
    splits = data.load("prompts", seed=1, layer=1, limit=12, batch_size=16)
    assert splits.info["cache_path"] == str(tmp_path / "env" / "prompts_l1_s1_n12.npy")
    assert (tmp_path / "env" / "prompts_l1_s1_n12.npy").is_file()


@pytest.fixture(scope="module")
def real_minilm():
    try:
        return minilm.load()
    except minilm_files.ModelFilesError as e:
        if os.environ.get("MINILM_REQUIRED"):
            raise
        pytest.skip(f"MiniLM model files unavailable: {e}")


def test_prompts_with_real_minilm(tmp_path, real_minilm):
    splits = data.load("prompts", seed=0, limit=48, cache_dir=tmp_path)
    assert splits.info["layer"] == 4
    assert sum(splits.info["sizes"].values()) == 48
    for x in (splits.x_train, splits.x_val, splits.x_test):
        assert x.shape[1] == 384 and x.dtype == np.float32 and np.isfinite(x).all()
    np.testing.assert_allclose(splits.x_train.mean(0), 0, atol=1e-4)
    assert (tmp_path / "prompts_l4_s0_n48.npy").is_file()
