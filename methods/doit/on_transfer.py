"""DOIT in the transfer setting (part 3 of the experiment; issue 25's transfer analogue): does
the transferability weight omega_t help DOIT train a pretrained network's new head?

Per seed: the digits MLP of methods/doit/problems.py is pretrained on digits 0-4 (core.digits'
train split; 40 cycles of 10 Adam steps at 1e-3, batch 64, ~47 epochs) with one fixed
optimiser, Adam, so that the pretrained network, and with it omega_t, is the same for every arm
of a seed and is not itself a product of a policy under test. Its penultimate features (256,
frozen) of digits 5-9 are the target task: a new linear head (5 classes) is trained on them
for 40 cycles of 10 steps (batch 64) by every arm, the same steps for all: DOIT with omega_t
(kNN accuracy and LogME of the frozen features, methods/doit/transferability.py), DOIT
without it (omega_t = 0, as from scratch), random switching, and each single optimiser of the
digits pool (the fixed learning rates of configs/doit.py). DOIT's cold start (10 cycles) is
identical with and without omega_t (same key, and omega_t only enters kappa afterwards), so
the pair isolates the weight. PCA of the head's kernel (2 components). Test accuracy on digits
5-9 of core.digits' test split; omega_p's kNN uses the train split as reference and the
validation split as queries (no test data).

Claims (margins fixed in this file before the first full run), on bootstrap intervals over
seeds of paired differences in final test accuracy:
- DOIT with omega_t is no worse than the best single optimiser in hindsight within 0.01;
- DOIT with omega_t beats DOIT without it (margin 0: the paper's ablation, "removing omega_t
  hurts");
- DOIT with omega_t is no worse than DOIT without it within 0.01.
"""

import dataclasses
import time

import jax
import numpy as np

import methods.doit as doit
from core import cycles, results
from core.claims import IntervalClaim
from methods.doit import problems, runs, transferability

SOURCE = (0, 1, 2, 3, 4)
TARGET = (5, 6, 7, 8, 9)
PRETRAIN_OPTIMIZER = "adam"
HEAD_LAYERS = "head/kernel"
ACCURACY_MARGIN = 0.01
EVERY = 1  # cycles between test evaluations
TRANSFER_ARM = "doit_transfer"


@dataclasses.dataclass(frozen=True)
class Settings:
    seeds: tuple = tuple(range(10))
    pretrain_cycles: int = 40
    cycles: int = 40


@jax.jit
def head_accuracy(params, x_ND, labels_N):
    logits = x_ND @ params["head"]["kernel"] + params["head"]["bias"]
    return (logits.argmax(-1) == labels_N).mean()


def target_features(backbone, splits: dict) -> dict:
    """The frozen penultimate features of each target split, labels shifted to 0..4."""
    return {
        name: {
            "x": np.asarray(problems.mlp_features(backbone, part["x"]), np.float32),
            "label": (part["label"] - TARGET[0]).astype(np.int32),
        }
        for name, part in splits.items()
    }


def transfer_weight(features: dict) -> dict:
    train, validation = features["train"], features["validation"]
    omega_p = transferability.knn_accuracy(
        train["x"], train["label"], validation["x"], validation["label"]
    )
    logme = transferability.logme(train["x"], train["label"])
    omega_t = transferability.weight(omega_p, [logme])
    return {"knn_accuracy": omega_p, "logme": logme, "omega_t": omega_t}


def measure(s: Settings) -> dict:
    pre_config = runs.task_config(
        "digits", s.pretrain_cycles, policy="single", single=PRETRAIN_OPTIMIZER
    )
    batch = pre_config.train.batch_size
    pretrainer = runs.Runner(pre_config, base=problems.digits_mlp(batch, classes=SOURCE))
    source_validation = problems.digits_arrays("validation", SOURCE)
    head_config = runs.task_config("digits", s.cycles, layers=HEAD_LAYERS)
    names = list(head_config.doit.pool)
    splits = {p: problems.digits_arrays(p, TARGET) for p in ("train", "validation", "test")}
    runner, rows = None, []
    for seed in s.seeds:
        start = time.perf_counter()
        pre, _, _ = pretrainer.run(seed, None, list(pre_config.doit.pool).index(PRETRAIN_OPTIMIZER))
        backbone = pre.state.params
        source_accuracy = float(problems.mlp_accuracy(backbone, source_validation["x"],
                                                      source_validation["label"]))  # fmt: skip
        features = target_features(backbone, splits)
        weight = transfer_weight(features)
        head = problems.linear_head(batch, features["train"], len(TARGET))
        # One compiled program for every seed: the head's data arrive as batches, not constants.
        runner = runner or runs.Runner(head_config, base=head)
        test = features["test"]
        accuracy = lambda state, t=test: head_accuracy(state.params, t["x"], t["label"])
        settings = doit.settings(head_config, len(names))
        with_weight = dataclasses.replace(settings, omega_t=weight["omega_t"])
        arms = {TRANSFER_ARM: (doit.hook_for("doit", with_weight), None)}
        arms |= {a: v for a, v in runs.arms(head_config).items() if a != "periodic"}
        for arm, (hook, first) in arms.items():
            _, history, curve = runner.run(
                seed, hook, first, evaluate=accuracy, every=EVERY, dataset=head.dataset
            )
            rows.append({
                "task": "digits_transfer", "arm": arm, "seed": seed,
                "test_accuracy": curve[-1][1],
                "curve": curve,
                "chosen": [int(r[cycles.OPTIMIZER]) for r in history],
                "source_accuracy": source_accuracy,
                **weight,
            })  # fmt: skip
        print(f"transfer seed {seed}: {time.perf_counter() - start:.1f} s {weight}", flush=True)
    return results.record(
        "doit",
        "full_transfer",
        config={
            "settings": dataclasses.asdict(s),
            "pool": names,
            "tau": head_config.doit.tau,
            "margin": ACCURACY_MARGIN,
            "pretrain_optimizer": PRETRAIN_OPTIMIZER,
            "beta": transferability.BETA,
            "knn_neighbours": transferability.KNN_NEIGHBOURS,
        },
        rows=rows,
    )


def claims_from_results(record: dict) -> list:
    rows, margin = record["rows"], record["config"]["margin"]
    by = lambda arm: {r["seed"]: r["test_accuracy"] for r in rows if r["arm"] == arm}
    mean_final = {a: np.mean(list(by(a).values())) for a in runs.SINGLES}
    best = max(mean_final, key=mean_final.get)
    mine, without = by(TRANSFER_ARM), by("doit")
    return [
        IntervalClaim.no_worse(
            f"transfer: DOIT with omega_t >= the best single optimizer in hindsight ({best}) "
            f"within {margin}",
            "transfer/doit_minus_best_single_accuracy",
            mine,
            by(best),
            margin,
        ),
        IntervalClaim.beats(
            "transfer: DOIT with omega_t beats DOIT without it (final test accuracy)",
            "transfer/with_minus_without_omega_accuracy",
            mine,
            without,
            0.0,
        ),
        IntervalClaim.no_worse(
            f"transfer: DOIT with omega_t >= DOIT without it within {margin}",
            "transfer/with_minus_without_omega_accuracy_within",
            mine,
            without,
            margin,
        ),
    ]


def summary(record: dict) -> dict:
    rows, names = record["rows"], record["config"]["pool"]
    arms = sorted({r["arm"] for r in rows})
    acc = {a: [r["test_accuracy"] for r in rows if r["arm"] == a] for a in arms}
    out = {a: {"mean": float(np.mean(v)), "std": float(np.std(v))} for a, v in acc.items()}
    weighted = [r for r in rows if r["arm"] == TRANSFER_ARM]
    for key in ("knn_accuracy", "logme", "omega_t", "source_accuracy"):
        values = [r[key] for r in weighted]
        out[key] = {"mean": float(np.mean(values)), "std": float(np.std(values))}
    for arm in (TRANSFER_ARM, "doit"):
        out[f"{arm}_shares"] = runs.shares([r["chosen"] for r in rows if r["arm"] == arm], names)
    return out
