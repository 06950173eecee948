"""Scores of a model's answers on the benchmark: accuracy per task, overall (micro and macro),
chance, invalid answers, bootstrap intervals, breakdowns and the position-bias diagnosis.

Overall accuracy is question-weighted (micro, the paper's); macro is the mean of the per-task
accuracies (a task with few questions counts as much as one with many). Chance differs per task
and per question (k options): a task's chance is the mean of 1 / k_i over its questions.

Intervals are percentile bootstrap intervals. The bootstrap of a mean of 0/1 values has an exact
form: the number of correct answers in a resample of n questions drawn with replacement is
Binomial(n, observed accuracy), so we draw that count instead of n indices (same distribution,
O(n_boot) per group instead of O(n * n_boot): 100k questions score in well under a second).
Macro resamples within each task (stratified): one binomial per task, then the mean.
"""

from collections.abc import Sequence

import numpy as np

from core.errors import ConfigError
from methods.fetal_gauge.records import LETTERS, Record
from methods.fetal_gauge.vocab import TASKS

BREAKDOWN_FIELDS = ("source_dataset", "region", "style", "bbox_bin")


def chance(records: Sequence[Record]) -> dict[str, float]:
    """Per task, the expected accuracy of a uniform guess: the mean of 1 / len(options)."""
    by_task: dict[str, list[float]] = {}
    for record in records:
        by_task.setdefault(record.task, []).append(1.0 / len(record.options))
    return {task: float(np.mean(values)) for task, values in _task_order(by_task).items()}


def _task_order(by_task: dict) -> dict:
    """The benchmark's task order (vocab.TASKS), any other task name after it."""
    rank = {task: i for i, task in enumerate(TASKS)}
    return {t: by_task[t] for t in sorted(by_task, key=lambda t: (rank.get(t, len(TASKS)), t))}


def _percentiles(resampled_GB: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(resampled_GB, [tail, 100.0 - tail], axis=-1)
    return low, high


def _check_level(level: float, n_boot: int) -> None:
    if not 0.0 < level < 1.0:
        raise ConfigError(f"fetal_gauge: level={level}; a coverage in (0, 1), e.g. 0.95")
    if n_boot < 1:
        raise ConfigError(f"fetal_gauge: n_boot={n_boot}; at least 1 bootstrap resample")


def _binomial_resamples(rng, n_G: np.ndarray, accuracy_G: np.ndarray, n_boot: int):
    """[G, n_boot] resampled accuracies of G groups (see the module doc: exact bootstrap)."""
    n_G = np.asarray(n_G, dtype=np.int64)
    counts_GB = rng.binomial(n_G[:, None], np.asarray(accuracy_G)[:, None], size=(len(n_G), n_boot))
    return counts_GB / np.maximum(n_G, 1)[:, None]


def bootstrap_interval(correct, *, seed: int = 0, n_boot: int = 2000, level: float = 0.95):
    """Percentile bootstrap interval (low, high) of the mean of `correct` (0/1 values)."""
    _check_level(level, n_boot)
    correct = np.asarray(correct, dtype=np.float64).ravel()
    if correct.size == 0:
        raise ConfigError("fetal_gauge: bootstrap_interval of no questions (correct is empty)")
    rng = np.random.default_rng(seed)
    resampled = _binomial_resamples(rng, [correct.size], [correct.mean()], n_boot)
    low, high = _percentiles(resampled, level)
    return float(low[0]), float(high[0])


def _prediction_array(records, predictions) -> np.ndarray:
    """Predictions as int64 with -1 for None (invalid); one line for a wrong length or index."""
    if len(predictions) != len(records):
        raise ConfigError(
            f"fetal_gauge: {len(predictions)} predictions for {len(records)} records; "
            "one prediction (an option index or None) per record"
        )
    predicted = np.array([-1 if p is None else int(p) for p in predictions], dtype=np.int64)
    num_options = np.array([len(r.options) for r in records], dtype=np.int64)
    bad = np.flatnonzero((predicted < -1) | (predicted >= num_options))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(
            f"fetal_gauge: prediction {predictions[i]!r} of qid {records[i].qid!r} is not an "
            f"option index in [0, {num_options[i]}) or None"
        )
    return predicted


def _group_stats(correct: np.ndarray, codes: np.ndarray, num_groups: int, rng, n_boot, level):
    """Per group code 0..G-1: n, accuracy, low, high (vectorised over groups)."""
    n_G = np.bincount(codes, minlength=num_groups)
    hits_G = np.bincount(codes, weights=correct, minlength=num_groups)
    accuracy_G = hits_G / np.maximum(n_G, 1)
    low_G, high_G = _percentiles(_binomial_resamples(rng, n_G, accuracy_G, n_boot), level)
    return n_G, accuracy_G, low_G, high_G


def _summary(n, accuracy, low, high) -> dict:
    return {"n": int(n), "accuracy": float(accuracy), "low": float(low), "high": float(high)}


def score(
    records: Sequence[Record],
    predictions: Sequence[int | None],
    *,
    seed: int = 0,
    n_boot: int = 2000,
    level: float = 0.95,
    by: Sequence[str] = BREAKDOWN_FIELDS,
) -> dict:
    """Every number of the scorecard (see the module doc and ISSUE45's contract for the keys)."""
    if not records:
        raise ConfigError("fetal_gauge: score of no records; give at least one question")
    _check_level(level, n_boot)
    for field in by:
        if field not in Record.__dataclass_fields__:
            raise ConfigError(f"fetal_gauge: by={field!r} is not a Record field")
    predicted = _prediction_array(records, predictions)
    answer = np.array([r.answer_idx for r in records], dtype=np.int64)
    inverse_k = np.array([1.0 / len(r.options) for r in records])
    correct = (predicted == answer).astype(np.float64)
    invalid = (predicted == -1).astype(np.float64)
    task_names = list(_task_order({r.task: None for r in records}))
    task_code = {t: i for i, t in enumerate(task_names)}
    task_of = np.array([task_code[r.task] for r in records], dtype=np.int64)
    num_tasks = len(task_names)
    rng = np.random.default_rng(seed)

    n_T, accuracy_T, low_T, high_T = _group_stats(correct, task_of, num_tasks, rng, n_boot, level)
    chance_T = np.bincount(task_of, weights=inverse_k, minlength=num_tasks) / n_T
    invalid_T = np.bincount(task_of, weights=invalid, minlength=num_tasks) / n_T
    tasks = {
        t: _summary(n_T[i], accuracy_T[i], low_T[i], high_T[i])
        | {"chance": float(chance_T[i]), "invalid_rate": float(invalid_T[i])}
        for i, t in enumerate(task_names)
    }

    micro = correct.mean()
    micro_low, micro_high = _percentiles(
        _binomial_resamples(rng, [len(records)], [micro], n_boot), level
    )
    macro_TB = _binomial_resamples(rng, n_T, accuracy_T, n_boot)  # stratified: within each task
    macro_low, macro_high = _percentiles(macro_TB.mean(axis=0), level)

    return {
        "n": len(records),
        "micro": _summary(len(records), micro, micro_low[0], micro_high[0]),
        "macro": _summary(len(records), accuracy_T.mean(), macro_low, macro_high),
        "chance_micro": float(inverse_k.mean()),
        "chance_macro": float(chance_T.mean()),
        "invalid_rate": float(invalid.mean()),
        "tasks": tasks,
        "by": {
            field: _breakdown(records, field, task_names, task_of, correct, rng, n_boot, level)
            for field in by
        },
        "position_bias": _position_bias(task_names, task_of, answer, correct),
        "predicted_letters": _predicted_letters(task_names, task_of, predicted),
        "level": level,
        "n_boot": n_boot,
        "seed": seed,
    }


def _breakdown(records, field, task_names, task_of, correct, rng, n_boot, level) -> dict:
    """{task: {value: summary}} over the records whose `field` has a value (None and "", the
    Record's "not given" defaults, are skipped)."""
    values = [getattr(r, field) for r in records]
    values = [None if v == "" else v for v in values]
    kept = np.array([v is not None for v in values], dtype=bool)
    if not kept.any():
        return {}
    distinct = sorted({str(v) for v in values if v is not None})
    value_code = {v: i for i, v in enumerate(distinct)}
    codes = np.array([value_code[str(v)] if v is not None else 0 for v in values])
    cell = (task_of * len(distinct) + codes)[kept]
    n_C, accuracy_C, low_C, high_C = _group_stats(
        correct[kept], cell, len(task_names) * len(distinct), rng, n_boot, level
    )
    table: dict = {}
    for c in np.flatnonzero(n_C):
        task, value = task_names[c // len(distinct)], distinct[c % len(distinct)]
        table.setdefault(task, {})[value] = _summary(n_C[c], accuracy_C[c], low_C[c], high_C[c])
    return table


def _position_bias(task_names, task_of, answer, correct) -> dict:
    """Accuracy by the correct option's letter: a model that prefers a position scores high on
    that letter and low on the others, even when its overall accuracy looks fine."""
    num_letters = int(answer.max()) + 1
    cell = task_of * num_letters + answer
    n_C = np.bincount(cell, minlength=len(task_names) * num_letters)
    hits_C = np.bincount(cell, weights=correct, minlength=len(task_names) * num_letters)
    table: dict = {}
    for c in np.flatnonzero(n_C):
        task, letter = task_names[c // num_letters], LETTERS[c % num_letters]
        table.setdefault(task, {})[letter] = {
            "n": int(n_C[c]),
            "accuracy": float(hits_C[c] / n_C[c]),
        }
    return table


def _predicted_letters(task_names, task_of, predicted) -> dict:
    """Per task, the fraction of ALL its questions answered with each letter (invalid answers
    are in no letter, so the fractions sum to 1 - the task's invalid rate)."""
    table: dict = {}
    n_T = np.bincount(task_of, minlength=len(task_names))
    valid = predicted >= 0
    num_letters = int(predicted.max()) + 1 if valid.any() else 0
    cell = task_of[valid] * max(num_letters, 1) + predicted[valid]
    counts_C = np.bincount(cell, minlength=len(task_names) * max(num_letters, 1))
    for i, task in enumerate(task_names):
        row = counts_C[i * num_letters : (i + 1) * num_letters] if num_letters else []
        table[task] = {LETTERS[j]: float(c / n_T[i]) for j, c in enumerate(row) if c}
    return table
