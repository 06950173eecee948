"""Think-Then-Embed (methods/tte): the task language, the examples, test-time traces without
leakage, the three roles through core.train, and bad inputs."""

import jax
import numpy as np
import pytest

from core import digits, train
from core.errors import ConfigError
from methods import tte
from methods.tte import embedder, examples, runs, tasks, traces
from tests.methods.mesh_check import losses_on_mesh


@pytest.fixture(scope="module")
def test_split():
    return tasks.split("test")


@pytest.mark.parametrize(
    "family,d,k,trace",
    [
        ("plus_k", (4, -1), 3, "<think> see 4 ; 4 + 3 = 7 </think> seven"),
        ("plus_k", (8, -1), 5, "<think> see 8 ; 8 + 5 = 3 </think> three"),
        ("nine_minus", (2, -1), -1, "<think> see 2 ; 9 - 2 = 7 </think> seven"),
        ("larger", (3, 6), -1, "<think> see 3 ; see 6 ; max = 6 </think> six"),
        ("vqa", (4, -1), -1, "<think> see 4 ; 4 even </think> yes"),
        ("vqa", (4, -1), 5, "<think> see 4 ; 4 < 5 </think> no"),
        ("vqa", (5, -1), 5, "<think> see 5 ; 5 = 5 </think> no"),
        ("classify", (0, -1), -1, "<think> see 0 </think> zero"),
    ],
)
def test_teacher_traces_compute_the_answer(family, d, k, trace):
    assert " ".join(tasks.trace_words(family, d, k, "full")) == trace
    assert tasks.trace_words(family, d, k, "final") == trace.split()[-1:]
    assert tasks.trace_words(family, d, k, "none") == []


def test_training_pairs_are_consistent(test_split):
    """The teacher's final word names the target: the target image's class (class-level), the
    query's own digit (simple), or the target text; labels key the target's identity."""
    rng = np.random.default_rng(0)
    seen = set()
    for _ in range(300):
        ex = examples.pair(rng, test_split, examples.QueryFormat("full"))
        family = tasks.FAMILIES[int(ex["family"])]
        seen.add(family)
        words = tasks.decode(ex["q_tokens"])
        final = words[words.index(tasks.VOCAB[tasks.EOS]) - 1]
        label = int(ex["label"])
        if family in ("vqa", "classify"):
            assert tasks.decode(ex["t_tokens"])[0] == final
            assert label == -1 - tasks.ANSWER_TEXTS.index(final)
        elif family == "simple":
            assert test_split.labels_N[label - 10] == tasks.NAMES.index(final)
        else:
            assert label == tasks.NAMES.index(final)
            assert np.all(ex["t_image"][:, 8:] == -1.0)  # one digit, on the left
    assert seen == set(tasks.FAMILIES)


def test_noisy_teacher_corrupts_at_its_rate():
    rng = np.random.default_rng(0)
    changed = [tasks.corrupt((3, 7), 0.3, rng) != (3, 7) for _ in range(4000)]
    assert abs(np.mean(changed) - 0.3) < 0.03  # 4.5 binomial standard errors (0.0072)
    assert all(tasks.corrupt((3, -1), 1.0, rng)[1] == -1 for _ in range(50))


@pytest.mark.parametrize("family", tasks.FAMILIES)
def test_galleries_hold_one_right_answer(test_split, family):
    q = examples.eval_queries(test_split, family, 20, seed=0)
    g = examples.gallery(test_split)
    if q.negatives is None:
        assert set(q.positive) <= set(examples.text_gallery(family))
        return
    assert q.negatives.shape == (20, tasks.GALLERY_SIZE - 1)
    for i in range(20):
        negs = q.negatives[i]
        assert len(set(negs)) == len(negs) and q.positive[i] not in negs
        if family == "simple":  # the query's own digit, at another shift; no negative shares it
            assert g.row[q.positive[i]] not in set(g.row[negs])
        else:
            assert g.label[q.positive[i]] == q.answer[i]
            assert not np.any(g.label[negs] == q.answer[i])


def test_precision_at_1_counts_the_positive_above_every_negative(test_split):
    q = examples.eval_queries(test_split, "plus_k", 4, seed=0)
    scores = np.zeros((4, len(examples.gallery(test_split).row)))
    scores[np.arange(4), q.positive] = 1.0
    scores[0, q.negatives[0, 5]] = 2.0  # query 0: a negative wins
    scores[1, q.negatives[1, 0]] = 1.0  # query 1: a tie is not a hit
    assert examples.precision_at_1(q, scores) == 0.5


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    settings = digits.ClassifierSettings(epochs=2)  # reads digits well enough to differ
    return digits.classifier(str(tmp_path_factory.mktemp("clf")), settings)


def _shuffled(q: examples.Queries) -> examples.Queries:
    perm = np.random.default_rng(0).permutation(len(q.k))
    return q._replace(shown=q.shown[perm], answer=q.answer[perm], positive=q.positive[perm])


@pytest.mark.parametrize("family", ["larger", "vqa"])
def test_test_time_traces_read_the_inputs_only(test_split, classifier, family):
    """Shuffled labels (shown digits, answers, positives) leave every test-time trace as it was:
    the teacher's (over the classifier's reading) and the reasoner's."""
    q = examples.eval_queries(test_split, family, 16, seed=0)
    shuffled = _shuffled(q)
    assert not np.array_equal(q.shown, shuffled.shown)
    for style, rho in (("full", 0.0), ("final", 0.0), ("full", 0.5)):
        a = traces.teacher(q, traces.perceive(classifier.params, q), style=style, rho=rho, seed=1)
        b = traces.teacher(
            shuffled, traces.perceive(classifier.params, shuffled), style=style, rho=rho, seed=1
        )
        assert a == b
    c = runs.role_config("smoke", 0, 1e-3, "reasoner")
    cfg = embedder.model_config(c)
    params = jax.device_get(tte.make(c).init(jax.random.key(0), None)["params"])
    assert traces.reasoner(cfg, params, q) == traces.reasoner(cfg, params, shuffled)


def test_reasoner_then_unified_head_leaves_the_reasoner_frozen(tmp_path):
    """The reasoner trains through core.train; TTE_u's head trains on it and the reasoner's
    params come back bit for bit."""
    rc = runs.role_config("smoke", 0, 1e-2, "reasoner")
    rc.train.steps = 3
    r = train.run(rc, tte.make(rc), str(tmp_path / "r"), devices=jax.devices()[:1])
    reasoner = jax.device_get(r.state.params)
    uc = runs.role_config("smoke", 0, 1e-2, "unified", head="mhsa", reasoner=str(tmp_path / "r"))
    uc.train.steps = 3
    u = train.run(uc, tte.make(uc), str(tmp_path / "u"), devices=jax.devices()[:1])
    after = jax.device_get(u.state.params)
    jax.tree.map(np.testing.assert_array_equal, after["reasoner"], reasoner)
    init = tte.make(uc).init(jax.random.key(uc.seed), None)["params"]["head"]
    moved = jax.tree.map(
        lambda a, b: np.abs(np.asarray(a) - np.asarray(b)).max(), after["head"], init
    )
    assert max(jax.tree.leaves(moved)) > 0


def test_grad_cache_and_plain_embedder_steps_agree(tmp_path):
    """The embedder's cached two-pass step and the plain gradient step give the same loss and
    parameters after two steps (float32; 1e-4: two Adam steps of summed chunk gradients)."""
    out = {}
    for chunks in (0, 2):
        c = runs.role_config("smoke", 0, 1e-3, "embedder", grad_cache_chunks=chunks)
        r = train.run(c, tte.make(c), str(tmp_path / str(chunks)), devices=jax.devices()[:1])
        out[chunks] = jax.device_get(r.state.params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4), out[0], out[2])


@pytest.mark.parametrize(
    "fields,match",
    [
        (dict(style="long"), "trace style"),
        (dict(rho=1.5), "rho=1.5"),
        (dict(style="none", trace_only=True), "trace_only needs a trace"),
        (dict(grad_cache_chunks=3), "grad_cache_chunks=3"),
        (dict(tau=0.0), "tau=0.0"),
    ],
)
def test_bad_embedder_settings_fail_in_one_line(fields, match):
    c = runs.role_config("smoke", 0, 1e-3, "embedder", **fields)
    with pytest.raises(ConfigError, match=match):
        tte.make(c)


def test_a_missing_reasoner_run_is_named(tmp_path):
    c = runs.role_config("smoke", 0, 1e-3, "unified", reasoner=str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match="nowhere"):
        tte.make(c)


def test_unknown_words_and_families_are_named():
    with pytest.raises(ConfigError, match="'seventeen'"):
        tasks.encode(["seventeen"])
    with pytest.raises(ConfigError, match="family 'sum'"):
        examples.eval_queries(tasks.split("validation"), "sum", 2, 0)


def test_negatives_span_the_global_batch_on_a_mesh():
    """GradCache's step on 8 devices (16 rows over the data axis, two chunks of 8: one row per
    device each) gives one device's losses: every query is scored against all 16 targets, not
    its device's two (a local-negatives bug would give a loss near 0). float32 sums in another
    order: rtol 1e-5."""
    config = runs.role_config("smoke", 0, 1e-3, "embedder")
    config.mesh.shape = (1, 1, 1)
    one, _ = losses_on_mesh(config, tte.make, devices=jax.devices()[:1])
    config.mesh.shape = (8, 1, 1)
    eight, _ = losses_on_mesh(config, tte.make)
    np.testing.assert_allclose(eight, one, rtol=1e-5)
