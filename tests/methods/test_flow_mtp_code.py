"""flow_mtp, part `code`: the byte corpus and its split, the code teacher's interface, and the
Medusa drafter (lossless under verification, blind to u)."""

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from core import corpus
from core.errors import ConfigError
from methods.flow_mtp import bins, code_teacher, decode, medusa
from methods.flow_mtp import teacher as teachers
from tests.methods.test_flow_mtp import (
    ALPHA,
    V_SMALL,
    chi_square_p,
    generated_counts,
    teacher_cell_probs,
)

# ------------------------------------------------------------------ corpus


def write_tree(root, files: dict) -> None:
    for rel, content in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(content)


TREE = {
    **{f"pkg{i // 10}/mod{i}.py": f"x = {i}\n".encode() * (i + 1) for i in range(40)},
    "test/test_a.py": b"assert 0\n",  # test suites and installed packages are left out
    "pkg0/tests/test_b.py": b"assert 0\n",
    "site-packages/other.py": b"import os\n",
    "pkg0/notes.txt": b"not python\n",
}


def test_corpus_split_is_deterministic_disjoint_and_by_path(tmp_path):
    write_tree(tmp_path, TREE)
    c = corpus.from_directory(str(tmp_path))
    paths = [p for p, _ in c.files]
    assert paths == sorted(p for p in TREE if "/mod" in p)
    assert not any("test" in p or "site-packages" in p for p in paths)
    by_split = {s: {p for p, _ in c.split_files(s)} for s in corpus.SPLITS}
    assert all(by_split.values())  # 40 files: each split gets some (fractions .8/.1/.1)
    assert set().union(*by_split.values()) == set(paths)
    assert sum(len(v) for v in by_split.values()) == len(paths)  # disjoint
    # The same tree read again gives the same split and bytes.
    again = corpus.from_directory(str(tmp_path))
    assert again.summary() == c.summary()
    np.testing.assert_array_equal(again.split("train"), c.split("train"))
    # A new file moves no other file: the split is a function of the path, not of a position.
    write_tree(tmp_path, {"pkg0/aaa_first.py": b"y = 1\n"})
    grown = corpus.from_directory(str(tmp_path))
    for s in corpus.SPLITS:
        assert by_split[s] <= {p for p, _ in grown.split_files(s)}


def test_corpus_hash_changes_when_one_byte_changes(tmp_path):
    write_tree(tmp_path, TREE)
    before = corpus.from_directory(str(tmp_path)).summary()
    rel = "pkg2/mod25.py"
    split = corpus.split_of(rel)
    write_tree(tmp_path, {rel: TREE[rel][:-2] + b"7\n"})  # one byte, same length
    after = corpus.from_directory(str(tmp_path)).summary()
    assert after["all"]["sha256"] != before["all"]["sha256"]
    assert after[split]["sha256"] != before[split]["sha256"]
    assert after[split]["bytes"] == before[split]["bytes"]
    for other in set(corpus.SPLITS) - {split}:
        assert after[other] == before[other]


def test_corpus_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="does not exist") as e:
        corpus.from_directory(str(tmp_path / "missing"))
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="no files"):
        corpus.from_directory(str(tmp_path))
    write_tree(tmp_path, TREE)
    with pytest.raises(ConfigError, match="split 'dev'"):
        corpus.from_directory(str(tmp_path)).split("dev")


def test_windows_are_seeded_and_inside_their_split(tmp_path):
    write_tree(tmp_path, TREE)
    c = corpus.from_directory(str(tmp_path))
    a = c.windows("train", length=8, count=50, seed=3)
    np.testing.assert_array_equal(a, c.windows("train", length=8, count=50, seed=3))
    train_text = c.split("train").tobytes()
    assert all(bytes(w.astype(np.uint8)) in train_text for w in a)


# ------------------------------------------------------------------ code teacher


def tiny_teacher(seed=0) -> code_teacher.CodeTeacher:
    s = code_teacher.TeacherSettings(1, 16, 2, 32, 16, 1, 4, 1e-3, 4)
    cfg = code_teacher.net_config(s)
    from core.nn import transformer

    return code_teacher.CodeTeacher(cfg, transformer.init_params(cfg, jax.random.PRNGKey(seed)))


def test_ar_sample_is_the_inverse_cdf_of_the_full_pass():
    """The KV-cached sampler picks, at each step, the byte whose bin (under the transformed
    distribution after the whole prefix, computed without a cache) holds that step's u."""
    teacher = tiny_teacher()
    transform = bins.SamplingTransform(temperature=0.7, top_k=50, top_p=0.95)
    context = jax.random.randint(jax.random.PRNGKey(1), (6, 5), 0, 256)
    u = jax.random.uniform(jax.random.PRNGKey(2), (6, 7))
    out = code_teacher.ar_sample(teacher, transform, context, u)
    logits = teacher.logits(jnp.concatenate([context, out], axis=1))[:, 4:-1]
    left, right = bins.bins_of(bins.sampling_probs(logits, transform), out)
    # Cached and uncached logits differ by float32 rounding (~1e-6), far inside these bins.
    assert bool(jnp.all((left <= u) & (u < right)))


# ------------------------------------------------------------------ Medusa


@dataclasses.dataclass(frozen=True, eq=False)
class MarkovWithFeatures:
    """A Markov teacher whose 'hidden state' is the one-hot last token (for Medusa heads)."""

    markov: teachers.MarkovTeacher

    def logits(self, tokens_BT):
        return self.markov.logits(tokens_BT)

    def features(self, tokens_BT):
        return jax.nn.one_hot(tokens_BT, self.markov.vocab_size)


def random_heads(D, V, L, seed):
    keys = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = medusa.init_params(jax.random.normal(keys[0], (D, V)), L)
    params["res_w"] = jax.random.normal(keys[1], params["res_w"].shape)
    params["res_b"] = jax.random.normal(keys[2], params["res_b"].shape)
    return params


def test_verification_of_a_medusa_draft_is_lossless():
    """Random heads (proposals that often disagree with the teacher) and inverse-CDF drafting
    at the round's u: the decoded continuations are exact teacher samples (chi-square)."""
    markov = teachers.random_markov(V_SMALL, seed=3)
    transform = bins.SamplingTransform(temperature=0.7)
    L = 3
    propose = medusa.drafter(MarkovWithFeatures(markov), random_heads(V_SMALL, V_SMALL, L, 5))
    counts, out = generated_counts(propose, markov, transform, L)
    assert int(out.accepted) < int(out.calls) * (L + 1)  # some drafts were rejected
    assert chi_square_p(counts, teacher_cell_probs(markov, transform)) > ALPHA


def u_blind(propose, context, u, L) -> bool:
    """Slot k's proposal is the inverse CDF at u_k of a distribution that no other u moves."""
    base = np.asarray(propose(context, None, u))
    for j in range(L):
        moved = np.asarray(propose(context, None, u.at[:, j].set(1 - u[:, j])))
        others = [k for k in range(L) if k != j]
        if not np.array_equal(moved[:, others], base[:, others]):
            return False
    return True


def test_a_medusa_head_cannot_see_u():
    teacher = tiny_teacher()
    L = 4
    params = random_heads(teacher.cfg.d_model, 256, L, 1)
    context = jax.random.randint(jax.random.PRNGKey(3), (64, 6), 0, 256)
    u = jax.random.uniform(jax.random.PRNGKey(4), (64, L))
    propose = jax.jit(medusa.drafter(teacher, params), static_argnums=1)
    assert u_blind(propose, context, u, L)
    # ... and each slot is exactly the inverse CDF of its head's own distribution at u_k.
    h = teacher.features(context)[:, -1]
    probs = jax.nn.softmax(medusa.head_logits(params, h), axis=-1)
    np.testing.assert_array_equal(
        np.asarray(propose(context, None, u)), np.asarray(bins.pick(bins.cdf_edges(probs), u))
    )

    # The check catches a drafter whose head sees an earlier u (a leak, as PTP's slots have).
    def leaky(context_BC, mask, u_BL):
        h_BD = teacher.features(context_BC)[:, -1]
        shifted_BL = jnp.roll(u_BL, 1, axis=1)
        logits = medusa.head_logits(params, h_BD)[..., :] + 50.0 * shifted_BL[..., None] * (
            jnp.arange(256) % 7 == 0
        )
        return bins.pick(bins.cdf_edges(jax.nn.softmax(logits, -1)), u_BL)

    assert not u_blind(jax.jit(leaky, static_argnums=1), context, u, L)


def test_medusa_heads_start_as_the_teachers_next_token_head():
    teacher = tiny_teacher()
    params = medusa.init_params(teacher.params["lm_head"]["kernel"], 3)
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 5), 0, 256)
    heads = medusa.head_logits(params, teacher.features(tokens)[:, -1])
    for k in range(3):  # zero residual weights: every head is the teacher's own head
        np.testing.assert_allclose(heads[:, k], teacher.logits(tokens)[:, -1], atol=1e-5)


def test_ptp_and_medusa_drafts_verify_against_the_code_teacher():
    """The code teacher plugs into the unchanged decode loop (smoke: shapes and accounting)."""
    teacher = tiny_teacher()
    L = 3
    params = random_heads(teacher.cfg.d_model, 256, L, 2)
    run = jax.jit(
        functools.partial(
            decode.generate,
            medusa.drafter(teacher, params),
            decode.markov_teacher_probs(teacher, bins.SamplingTransform(0.7, 50, 0.95)),
            num_tokens=10,
            completion_len=L,
        )
    )
    prompt = jax.random.randint(jax.random.PRNGKey(0), (4, 6), 0, 256)
    out = run(prompt, jnp.ones((4, 6), bool), jax.random.PRNGKey(1))
    assert out.tokens_BN.shape == (4, 10)
    assert int(out.calls) <= int(out.accepted) <= int(out.calls) * (L + 1)


# ------------------------------------------------------------------ quick experiment, bench


@pytest.mark.slow  # a teacher and six drafters: ~1 min idle, several under shared load
def test_quick_code_experiment(tmp_path):
    import json

    from methods.flow_mtp import code_experiment

    report = code_experiment.run(str(tmp_path), quick=True)
    record = json.loads(json.dumps(report.results))  # what results.save writes and load reads
    rows = record["rows"]
    assert {(r["part"], r["variant"], r["seed"]) for r in rows} == {
        ("code", v, s) for v in code_experiment.VARIANTS for s in code_experiment.SEEDS
    }
    L = record["config"]["settings"]["completion_len"]
    assert all(1 <= r["accepted_per_call"] <= L + 1 and 0 <= r["correct"] <= L for r in rows)
    again = code_experiment.claims_code(record)
    assert [c.interval.mean for c in again] == [c.interval.mean for c in report.claims]
    assert report.claims[1].holds  # PTP's correct prefix (an untrained student's is ~0)


@pytest.mark.slow  # trains the quick teacher and a 2-step student
def test_code_bench_smoke(tmp_path):
    from methods.flow_mtp import bench

    result = bench.measure_code(smoke=True, workdir=str(tmp_path))
    assert result.details["accepted_per_call"] >= 1.0
    assert all(r.a > 0 and r.b > 0 for r in result.ratios)
