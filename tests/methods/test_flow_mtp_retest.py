"""flow_mtp's re-test (issue 47): decoding's acceptance accounting, the LoRA student (frozen
teacher, slots shifted), one pool and one budget for both drafters, C-PTP's selection budget,
and the v2 records' wiring."""

import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import core.data
from core import experiment_runner, results
from core.errors import ConfigError
from core.experiment_runner import Arm
from core.nn import transformer
from methods.flow_mtp import (
    acceptance_check,
    bins,
    code_drafters,
    code_teacher,
    code_v2,
    decode,
    experiment,
    experiment_code_v2,
    experiment_cptp,
    lora_student,
    model,
)
from methods.flow_mtp import teacher as teachers
from tests.methods.test_flow_mtp import oracle

# ------------------------------------------------------------------ acceptance accounting


def test_each_call_accepts_its_matches_plus_one_and_rows_add_up():
    """An oracle drafter accepts L + 1 per call, one wrong at its first token exactly 1; with
    the two in alternate rows, rows finish at different rounds, so an off-by-one in the
    accepted count or a call counted for a finished row shows; rows add up to the totals."""
    teacher = teachers.random_markov(6, seed=1)
    transform = bins.SamplingTransform(temperature=0.7)
    L, B = 3, 16
    right = oracle(teacher, transform)
    even_B = jnp.arange(B) % 2 == 0

    def mixed(context_BC, mask_BC, u_BL):  # odd rows: the teacher's pick + 1, never accepted
        proposal_BL = right(context_BC, mask_BC, u_BL)
        return jnp.where(even_B[:, None], proposal_BL, (proposal_BL + 1) % 6)

    run = jax.jit(
        functools.partial(
            decode.generate, mixed, decode.markov_teacher_probs(teacher, transform),
            num_tokens=10, completion_len=L,
        )
    )  # fmt: skip
    out = jax.device_get(
        run(jnp.zeros((B, 2), jnp.int32), jnp.ones((B, 2), bool), jax.random.key(0))
    )
    per_call_B = np.where(even_B, L + 1, 1)
    np.testing.assert_array_equal(out.accepted_B, per_call_B * out.calls_B)
    np.testing.assert_array_equal(out.calls_B, np.where(even_B, 3, 10))  # ceil(10 / per call)
    assert int(out.accepted) == int(out.accepted_B.sum())
    assert int(out.calls) == int(out.calls_B.sum())


def test_accepted_per_call_is_a_mean_over_calls_not_over_positions():
    """Why decoding accepts fewer tokens per call than correct prefix + 1 on the test
    completions (acceptance_check): calls start where the previous call stopped, so a hard
    stretch (1 token per call) holds most calls. Ten hard positions then ten easy ones (9 per
    call): the arithmetic mean over positions is 5, the replayed decoding 28 / 12."""
    accept_KBP = np.array([[[1] * 10 + [9] * 10]])
    assert acceptance_check.walk(accept_KBP) == pytest.approx(28 / 12)
    figures = acceptance_check.summary(accept_KBP)
    assert figures["arithmetic"] == pytest.approx(5.0)
    assert figures["harmonic"] == pytest.approx(1 / np.mean(1 / accept_KBP))


# ------------------------------------------------------------------ LoRA student


def small_teacher(seed=0) -> code_teacher.CodeTeacher:
    """A random 1-layer byte teacher with room for v2's context + slots (16 + 8)."""
    s = code_teacher.TeacherSettings(1, 16, 2, 32, 64, 1, 4, 1e-3, 4)
    cfg = code_teacher.net_config(s)
    return code_teacher.CodeTeacher(cfg, transformer.init_params(cfg, jax.random.PRNGKey(seed)))


def fake_pool(count: int, C: int = 16, L: int = 8, D: int = 16, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    left = rng.uniform(0, 0.5, (count, L)).astype(np.float32)
    return {
        "context": rng.integers(0, 256, (count, C)).astype(np.int32),
        "context_mask": np.ones((count, C), bool),
        "completion": rng.integers(0, 256, (count, L)).astype(np.int32),
        "u": rng.uniform(0, 1, (count, L)).astype(np.float32),
        "left": left,
        "right": left + 0.25,
        "h": rng.normal(size=(count, D)).astype(np.float32),
        "seconds": np.float64(0.0),
    }


def test_lora_student_starts_as_the_teacher_with_its_slots_one_position_earlier():
    """B = 0: the cached-context student is the one-call student of model.py with the
    teacher's weights, shift on as in v2 (and off with shift off; the shift changes logits)."""
    teacher = small_teacher()
    cfg = model.StudentConfig(teacher.cfg, 16, 8)
    params = lora_student.init_params(
        teacher.params, lora_student.LoraSettings(), 16, jax.random.key(1)
    )
    context = jax.random.randint(jax.random.key(2), (4, 16), 0, 256)
    mask = jnp.arange(16)[None, :] >= jnp.array([[0], [0], [3], [9]])  # left-padded rows
    u = jax.random.uniform(jax.random.key(3), (4, 8))
    one_call = {"net": teacher.params, "u_anchors": params["u_anchors"]}

    @functools.partial(jax.jit, static_argnums=0)
    def both(shift):
        lora = lora_student.LoraSettings(shift_positions=shift)
        got = lora_student.slot_logits(cfg, lora, teacher.params, params, context, mask, u)
        one = dataclasses.replace(cfg, shift_positions=shift)
        return got, model.student_logits(one, one_call, context, mask, u)

    got = {}
    for shift in (True, False):
        got[shift], want = both(shift)
        # the cache's attention vs one call: float32 rounding only
        np.testing.assert_allclose(got[shift], want, atol=2e-5)
    assert not np.allclose(got[True], got[False], atol=1e-3)
    assert experiment_code_v2.LORA.shift_positions  # v2's student has the official shift


def test_lora_student_trains_adapters_only_and_reads_the_frozen_teacher():
    """The v2 PTP drafter's parameters are adapters and anchors (a full fine-tune holds the
    network: fails); after a few steps every adapted kernel moved by rank <= r and the slots
    still read the teacher's weights as given (perturbing them moves the logits)."""
    teacher = small_teacher()
    s = dataclasses.replace(experiment_code_v2.V2, batch_size=8)
    lora = experiment_code_v2.LORA
    method = code_v2.drafter_method("ptp", teacher, s, lora, fake_pool(8))
    params = method.init(jax.random.key(0), None)["params"]
    assert set(params) == {"lora", "u_anchors"}
    batch = {k: jnp.asarray(v) for k, v in fake_pool(8, seed=1).items() if k != "seconds"}
    grad_fn = jax.jit(jax.grad(lambda p, r: method.loss(p, batch, rng=r)[0]))
    for i in range(3):
        grads = grad_fn(params, jax.random.key(i))
        params = jax.tree.map(lambda p, g: p - 0.5 * g, params, grads)
    adapted = lora_student.merged(teacher.params, params["lora"], lora)
    flat_t = {
        lora_student._path(k): v for k, v in jax.tree_util.tree_leaves_with_path(teacher.params)
    }
    flat_a = {lora_student._path(k): v for k, v in jax.tree_util.tree_leaves_with_path(adapted)}
    targets = set(lora_student.target_paths(teacher.params, lora))
    assert len(targets) == 7  # q, k, v, o, gate, up, down of the one block
    for path, w in flat_t.items():
        delta = np.asarray(flat_a[path] - w, np.float64)
        if path in targets:
            assert 0 < np.linalg.matrix_rank(delta, tol=1e-6) <= lora.rank, path
        else:
            np.testing.assert_array_equal(delta, 0.0)
    cfg = code_drafters.student_config(teacher, s)
    args = (batch["context"], batch["context_mask"], batch["u"])
    logits = jax.jit(lambda net: lora_student.slot_logits(cfg, lora, net, params, *args))
    before, after = logits(teacher.params), logits(jax.tree.map(lambda w: w * 1.1, teacher.params))
    assert not np.allclose(before, after, atol=1e-3)


# ------------------------------------------------------------------ one pool, one budget


def test_ptp_and_medusa_train_on_the_same_pool_for_the_same_steps(monkeypatch):
    """Both arms' configs differ only in the drafter (and the grid's lr, the seed), and a run
    hands each drafter's dataset the same training pool, for the same steps and batch."""
    a, b = (experiment_code_v2.config_of(Arm(d), {"lr": 1e-3}, 2, False) for d in ("ptp", "medusa"))
    assert (a.drafter, b.drafter) == ("ptp", "medusa")
    assert a.part.pool >= 16_384 and a.train.steps >= 2500 and a.part.decode_rows >= 256
    del a["drafter"], b["drafter"]
    assert a.to_dict() == b.to_dict()

    teacher, pools = small_teacher(), {}

    def pool(teacher_, s, split, count, workdir):
        return pools.setdefault(split, fake_pool(8, seed=len(pools)))

    seen = {}

    class Stop(Exception):
        pass

    def fake_train_run(config, method, run_dir, devices=None):
        method.dataset("train", shard=None, seed=config.seed)
        seen[config.drafter]["steps"] = (config.train.steps, config.train.batch_size)
        raise Stop

    def in_memory(arrays, **kwargs):
        seen[current[0]]["arrays"] = arrays

    monkeypatch.setattr(code_v2, "teacher_of", lambda s, workdir: (teacher, {}))
    monkeypatch.setattr(code_v2, "pool", pool)
    monkeypatch.setattr(code_v2.train, "run", fake_train_run)
    monkeypatch.setattr(core.data, "in_memory", in_memory)
    current = [None]
    for drafter in ("ptp", "medusa"):
        current[0] = drafter
        seen[drafter] = {}
        config = experiment_code_v2.config_of(Arm(drafter), {"lr": 1e-3}, 0, False)
        with pytest.raises(Stop):
            code_v2.run(config, "/nonexistent/runs/key")
    assert seen["ptp"]["steps"] == seen["medusa"]["steps"]
    for drafter in ("ptp", "medusa"):
        assert seen[drafter]["arrays"]["completion"] is pools["train"]["completion"]
    assert seen["medusa"]["arrays"]["h"] is pools["train"]["h"]
    assert seen["ptp"]["arrays"]["context"] is pools["train"]["context"]


def test_pools_are_generated_once_per_workdir_even_if_a_source_is_touched(tmp_path, monkeypatch):
    """Every run of a grid reads the pool from disk: the second request regenerates nothing,
    even when the sources' hash moves in between (another session's edit of core/ for a
    moment: the grid's runs then drew three different 16k pools, 2026-12-06)."""
    calls, hashes = [], iter(range(100))
    monkeypatch.setattr(
        code_v2.code_drafters,
        "teacher_pool",
        lambda teacher, s, split, count, seed: calls.append(split) or fake_pool(count),
    )
    monkeypatch.setattr(code_v2.results, "source_hash", lambda files: str(next(hashes)))
    code_v2.source_hash.cache_clear()
    s = experiment_code_v2.QUICK
    first = code_v2.pool(None, s, "train", 8, str(tmp_path))
    second = code_v2.pool(None, s, "train", 8, str(tmp_path))
    code_v2.source_hash.cache_clear()  # later tests hash the real sources again
    assert calls == ["train"]
    np.testing.assert_array_equal(first["completion"], second["completion"])


# ------------------------------------------------------------------ C-PTP, records


def test_cptp_v2_chooses_its_rate_at_a_third_of_the_budget_and_refuses_an_edge():
    v2 = experiment_cptp.V2
    assert v2.steps >= 6000 and 3 * v2.select_steps >= v2.steps
    assert v2.nll_margin == 0.05 and len(experiment_cptp.SEEDS_V2) >= 3
    rows = [{"part": "cptp", "variant": v, "seed": s, "nll": 0.7, "correct": 5.0}
            for v in ("cptp", "ar") for s in (0, 1, 2)]  # fmt: skip
    chosen = {"cptp": {"lr": 3e-3, "edge": None}, "ar": {"lr": 3e-2, "edge": "high"}}
    part = {"settings": dataclasses.asdict(v2), "chosen": chosen}
    record = {"run": "full_cptp_v2", "rows": rows, "config": {"cptp": part}}
    with pytest.raises(ConfigError, match="widen"):
        experiment.claims_from_results(record)
    chosen["ar"]["edge"] = None
    assert [c.holds for c in experiment.claims_from_results(record)] == [True, True]


def test_v2_records_join_result_runs_only_with_their_files():
    assert experiment.V2_RUNS == ("full_code_v2", "full_cptp_v2")
    for run in experiment.V2_RUNS:
        has_record = os.path.exists(results.path("flow_mtp", run))
        assert (run in experiment.RESULT_RUNS) == has_record, run


def fake_run(config, run_dir):
    """PTP 0.5 tokens per call above Medusa; lr 3e-3 best on validation for both."""
    del run_dir
    bonus = {"ptp": 0.5, "medusa": 0.0}[config.drafter]
    penalty = abs(np.log10(config.optim.lr / 3e-3))
    return {"validation/correct": 3.0 - penalty, "test/correct": 3.0 + bonus + 0.01 * config.seed,
            "test/accepted_per_call": 3.0 + bonus + 0.02 * config.seed}  # fmt: skip


def test_code_v2_claims_derive_from_the_record_after_a_json_round_trip(tmp_path):
    fake = dataclasses.replace(experiment_code_v2.EXPERIMENT, run=fake_run)
    record = experiment_runner.measure(fake, str(tmp_path))
    assert record["run"] == "full_code_v2"
    results.save(record, str(tmp_path / "results"))
    reread = results.load("flow_mtp", "full_code_v2", str(tmp_path / "results"))
    claims = experiment.claims_from_results(reread)
    assert [c.holds for c in claims] == [True, True, True]
    assert claims[0].interval.mean == pytest.approx(0.5)
    assert experiment_runner.choices(reread)["ptp"].point == {"lr": 3e-3}


@pytest.mark.slow  # the quick teacher, pools and six drafters: ~2 min on 2 busy cores
def test_quick_code_v2_runs_end_to_end(tmp_path):
    record = experiment_runner.measure(experiment_code_v2.EXPERIMENT, str(tmp_path), quick=True)
    rows = record["rows"]
    assert {(r["arm"], r["seed"]) for r in rows} == {
        (a, s) for a in code_v2.DRAFTERS for s in (0, 1, 2)
    }
    assert len({r["pool"]["train"] for r in rows}) == 1  # one pool for every run
    L = experiment_code_v2.QUICK.completion_len
    assert all(1 <= r["test/accepted_per_call"] <= L + 1 for r in rows)
    assert len(experiment_code_v2.claims_from_results(record)) == 2
