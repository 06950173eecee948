"""RLCR's claims at CPU scale: RLVR vs RLCR on the noisy-witness task, in and out of domain.

Per seed, both arms start from the same format warm start (same seed: same init, same data) and
run GRPO with the same budget through `core.train`; they differ only in the Brier weight
(0.5 vs 0). Each trained policy answers fresh in-domain and out-of-domain questions greedily:

- verbalized confidence: the stated confidence token (both arms);
- answer probability: the emitted answer token's probability (both arms);
- post-hoc probe (RLVR): logistic regression of correctness on the frozen final hidden state at
  the answer token, fitted on fresh in-domain questions;
- voting: `vote_samples` samples per question at the training temperature; plain majority vs
  confidence-weighted vote vs the single most confident sample.

The task's exact posterior gives the ideal confidence of every answer the policy gives
(`ideal_q`); the Brier score of stating it is the floor for that policy's answers, and the
Bayes-optimal answerer's accuracy and Brier are reported beside.

Claims (in-domain, means over seeds unless stated):
- accuracy: |RLCR - RLVR| <= ACC_TOL;
- RLCR's ECE <= ECE_TARGET and its Brier within BRIER_GAP of the floor for its own answers;
- RLCR's ECE is far below RLVR's (ratio <= ECE_RATIO), also out of domain (RLCR < RLVR);
- RLVR's stated confidence is uninformative: |AUROC - 0.5| <= AUROC_BAND;
- for RLCR, confidence-weighted voting >= majority voting.
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from configs import rlcr as rlcr_config
from core import train
from core.claims import Claim, Report
from core.errors import ConfigError
from core.precision import compute_dtype
from methods import rlcr
from methods.rlcr import calibration, evaluation, policy, witness

ARMS = ("rlvr", "rlcr")
CONFIDENCES = ("verbalized", "verbalized_mean", "answer_prob", "probe", "ideal")
FAMILIES = (witness.IN_DOMAIN, witness.OUT_OF_DOMAIN)
# "Within about 2 points" (the issue; the paper: 63.0 vs 62.1 on HotpotQA, 72.9 vs 72.7 maths).
ACC_TOL = 0.02
# Our plan's expectation for this task: ECE <= 0.05 and Brier within 0.01-0.02 of the floor.
ECE_TARGET = 0.05
BRIER_GAP = 0.02
# "Far below": the paper's HotpotQA ECE is 0.03 vs 0.37 (x12); we ask for x3.
ECE_RATIO = 1 / 3
# "Near 0.5": the repo's RLVR rows have AUROC 0.50 with q fixed near 1.
AUROC_BAND = 0.1
# The reduced run's claim, on the greedy stated confidence like every other: at most half of
# the warm start's ECE is left. The warm start's greedy confidence is the mode of a nearly flat
# distribution, an arbitrary token per seed (ECE 0.10-0.27 measured), hence a ratio rather than
# a difference. Measured: QUICK 0.008 / 0.279 (seed 0; seeds 1 and 2: 0.064 / 0.305 and
# 0.048 / 0.094, which fails); FULL 0.059 / 0.157 (README).
ECE_KEPT = 0.5


@dataclasses.dataclass(frozen=True)
class Setting:
    seeds: tuple[int, ...]
    size: str
    rl_steps: int
    eval_examples: int
    probe_examples: int
    vote_examples: int
    vote_samples: int
    overrides: tuple[tuple[str, str, object], ...] = ()
    # What is trained and measured; the first arm's run also gives the warm start's params.
    # probe_examples = 0 skips the probe, vote_examples = 0 skips voting.
    arms: tuple[str, ...] = ARMS
    families: tuple[str, ...] = tuple(f.name for f in FAMILIES)

    def __post_init__(self):
        names = tuple(f.name for f in FAMILIES)
        if not self.arms or not set(self.arms) <= set(ARMS):
            raise ConfigError(f"Setting.arms={self.arms!r} must be a non-empty subset of {ARMS}")
        if not self.families or not set(self.families) <= set(names):
            raise ConfigError(
                f"Setting.families={self.families!r} must be a non-empty subset of {names}"
            )


FULL = Setting(
    seeds=(0, 1, 2),
    size="small",
    rl_steps=400,
    eval_examples=4000,
    probe_examples=4000,
    vote_examples=2000,
    vote_samples=8,
)
# Only what its one claim reads: RLCR against the warm start, in domain. One training run (the
# warm start's params are read from it) and one evaluation compile, no probe, no voting.
QUICK = Setting(
    seeds=(0,),
    size="small",
    rl_steps=40,
    eval_examples=1000,
    probe_examples=0,
    vote_examples=0,
    vote_samples=8,
    overrides=(("model", "d_model", 64), ("model", "d_ff", 128), ("train", "batch_size", 32)),
    arms=("rlcr",),
    families=(witness.IN_DOMAIN.name,),
)


def arm_config(arm: str, seed: int, setting: Setting):
    c = rlcr_config.get_config(f"arm={arm},size={setting.size}")
    c.seed = seed
    c.train.steps = c.warm_start.steps + setting.rl_steps
    c.train.checkpoint_every = 0
    c.train.eval_every = -1  # evaluated here, once, on larger sets
    c.train.log_every = max(1, c.train.steps // 10)
    for section, name, value in setting.overrides:
        c[section][name] = value
    return c


def measure(cfg, params, seed: int, setting: Setting, temperature: float) -> dict:
    """Every number of one trained policy, per family of `setting.families`, and reliability
    bins for the plots; "probe" and "votes" only where `setting` asks for them."""
    # One stream in a fixed order (probe, then FAMILIES' order): what is skipped changes the
    # questions drawn after it, so FULL keeps its questions only while it skips nothing.
    rng = np.random.default_rng([seed, 7])
    probe = None
    if setting.probe_examples:
        probe_data = witness.sample(rng, setting.probe_examples, witness.IN_DOMAIN)
        probe_out = evaluation.answer(cfg, params, probe_data)
        probe = evaluation.fit_probe(probe_out["hidden"], probe_out["correct"], seed=seed)
    result = {}
    for f, family in enumerate(FAMILIES):
        if family.name not in setting.families:
            continue
        data = witness.sample(rng, setting.eval_examples, family)
        out = evaluation.answer(cfg, params, data)
        probed = {}
        if probe is not None:
            probed["probe"] = evaluation.probe_confidence(probe, out["hidden"])
        confidences = {
            "verbalized": out["q"],
            "verbalized_mean": out["mean_q"],
            "answer_prob": out["answer_prob"],
            **probed,
            "ideal": out["ideal_q"],  # the exact posterior of the policy's own answers
        }
        correct = out["correct"]
        votes = {}
        if setting.vote_examples:
            votes["votes"] = evaluation.vote(
                cfg,
                params,
                {k: v[: setting.vote_examples] for k, v in data.items()},
                rng=jax.random.key(1000 * seed + f),
                num_samples=setting.vote_samples,
                temperature=temperature,
            )
        result[family.name] = {
            "format": float(out["format_ok"].mean()),
            "mean_q": float(out["q"].mean()),
            "scores": {k: evaluation.summary(q, correct) for k, q in confidences.items()},
            "bins": {k: reliability_lists(q, correct) for k, q in confidences.items()},
            **votes,
            "bayes": witness.bayes_summary(data["counts"], data["rho"]),
        }
    return result


def reliability_lists(q_N, correct_N) -> dict[str, list]:
    conf, acc, count = calibration.reliability(q_N, correct_N)
    return {
        "confidence": np.asarray(conf).tolist(),
        "accuracy": np.asarray(acc).tolist(),
        "count": np.asarray(count).tolist(),
    }


def train_policy(config, workdir: str, *, keep_step: int | None = None):
    """Train through `core.train` (warm start, then GRPO): (the final params, a copy of the
    params after step `keep_step`, or None when not asked for or not passed, e.g. when the run
    resumed from a later checkpoint)."""
    method, kept = rlcr.make(config), {}
    if keep_step is not None:

        def hook(state, *, step):
            if step == keep_step:
                # A device copy (the next step donates the state's buffers): host arrays would
                # give the evaluation's jitted functions other input shardings, and a recompile.
                kept["params"] = jax.tree.map(jnp.copy, state.params)

        method = method._replace(hook=hook)
    return train.run(config, method, workdir).state.params, kept.get("params")


def mean_over_seeds(per_seed: list[dict], *path) -> float:
    values = []
    for run_result in per_seed:
        for key in path:
            run_result = run_result[key]
        values.append(run_result)
    return float(np.nanmean(values))


def run(workdir: str, quick: bool = False) -> Report:
    setting = QUICK if quick else FULL
    runs = {arm: [] for arm in (*setting.arms, "start")}
    for seed in setting.seeds:
        for arm in setting.arms:
            config = arm_config(arm, seed, setting)
            cfg = policy.model_config(config.model, compute_dtype(config.dtype))
            temperature = config.grpo.temperature
            # The shared starting point, the warm start alone, is the first arm's params after
            # its warm-start steps: no run of its own. Any arm gives the same params (QUICK runs
            # rlcr alone): the arm sets only `rewards`, which only the GRPO branch of
            # `rlcr.make`'s step reads; the warm start's loss, optimiser, data and init
            # depend on model, warm_start, batch size and seed alone (tested).
            first = arm == setting.arms[0]
            params, start = train_policy(
                config,
                os.path.join(workdir, f"{arm}-{seed}"),
                keep_step=config.warm_start.steps if first else None,
            )
            if first:
                if start is None:  # resumed past the warm start: train it alone
                    alone = arm_config(arm, seed, setting)
                    alone.train.steps = alone.warm_start.steps
                    start, _ = train_policy(alone, os.path.join(workdir, f"start-{seed}"))
                runs["start"].append(measure(cfg, start, seed, setting, temperature))
            runs[arm].append(measure(cfg, params, seed, setting, temperature))
            print(f"seed {seed} {arm}: " + line(runs[arm][-1]), flush=True)
    figure = os.path.join(workdir, "rlcr_reliability.png")
    plot(runs, figure)
    metrics = {"setting": dataclasses.asdict(setting), "runs": runs, "table": table(runs)}
    print(notes(runs), flush=True)
    return Report(
        method="rlcr",
        claims=claims(runs, quick),
        metrics=metrics,
        command="python -m launch.reproduce --methods=rlcr" + (" --quick" if quick else ""),
        notes=notes(runs),  # printed above too: the claims table shows only the claims
        figures=[figure],
    )


def line(result: dict) -> str:
    parts = []
    for name, family_result in result.items():
        s = family_result["scores"]["verbalized"]
        parts.append(
            f"{name} acc {s['accuracy']:.3f} ece {s['ece']:.3f} brier {s['brier']:.3f} "
            f"auroc {s['auroc']:.3f}"
        )
    return " | ".join(parts)


def table(runs: dict) -> dict:
    """Means over seeds: {arm: {family: {confidence: {metric: value}}}} plus votes and floors,
    for the arms, families, confidences and votes that were measured (as for the first seed)."""
    out = {}
    for arm, per_seed in runs.items():
        out[arm] = {}
        for name, measured in per_seed[0].items():
            entry = {
                conf: {
                    metric: mean_over_seeds(per_seed, name, "scores", conf, metric)
                    for metric in ("accuracy", "ece", "brier", "auroc")
                }
                for conf in CONFIDENCES
                if conf in measured["scores"]
            }
            if "votes" in measured:
                entry["votes"] = {
                    k: mean_over_seeds(per_seed, name, "votes", k)
                    for k in ("single", "majority", "weighted", "max_confidence")
                }
            entry["bayes"] = {
                k: mean_over_seeds(per_seed, name, "bayes", k) for k in ("accuracy", "brier")
            }
            entry["format"] = mean_over_seeds(per_seed, name, "format")
            out[arm][name] = entry
    return out


def claims(runs: dict, quick: bool) -> list[Claim]:
    t = table(runs)
    ind, ood = witness.IN_DOMAIN.name, witness.OUT_OF_DOMAIN.name
    verbal = lambda arm, fam, metric: t[arm][fam]["verbalized"][metric]  # noqa: E731
    out = [
        # The suite's reduced run asserts this one: the Brier term moves the stated confidence
        # towards the accuracy from the warm start's uninformed one.
        Claim(
            "RLCR lowers the ECE of its stated confidence against the warm start (in domain)",
            "ece_rlcr / ece_start",
            verbal("rlcr", ind, "ece") / verbal("start", ind, "ece"),
            "<=",
            ECE_KEPT,
        ),
    ]
    if quick:
        return out
    rlcr_in, rlvr_in = t["rlcr"][ind], t["rlvr"][ind]
    return out + [
        Claim(
            "RLCR and RLVR reach the same accuracy, within 2 points (in domain)",
            "|acc_rlcr - acc_rlvr|",
            abs(rlcr_in["verbalized"]["accuracy"] - rlvr_in["verbalized"]["accuracy"]),
            "<=",
            ACC_TOL,
        ),
        Claim(
            "RLCR's stated confidence is calibrated (in domain)",
            "ece_rlcr",
            verbal("rlcr", ind, "ece"),
            "<=",
            ECE_TARGET,
        ),
        Claim(
            "RLCR's Brier score is near the floor for its own answers (in domain)",
            "brier_rlcr - brier_ideal",
            rlcr_in["verbalized"]["brier"] - rlcr_in["ideal"]["brier"],
            "<=",
            BRIER_GAP,
        ),
        Claim(
            "RLCR's ECE is far below RLVR's (in domain)",
            "ece_rlcr / ece_rlvr",
            verbal("rlcr", ind, "ece") / verbal("rlvr", ind, "ece"),
            "<=",
            ECE_RATIO,
        ),
        Claim(
            "RLCR's ECE is below RLVR's out of domain",
            "ece_rlcr / ece_rlvr (ood)",
            verbal("rlcr", ood, "ece") / verbal("rlvr", ood, "ece"),
            "<",
            1.0,
        ),
        Claim(
            "RLVR's stated confidence is uninformative: AUROC near 0.5 (in domain)",
            "|auroc_rlvr - 0.5|",
            abs(verbal("rlvr", ind, "auroc") - 0.5),
            "<=",
            AUROC_BAND,
        ),
        Claim(
            "Confidence-weighted voting is at least as accurate as majority voting (RLCR)",
            "weighted - majority",
            rlcr_in["votes"]["weighted"] - rlcr_in["votes"]["majority"],
            ">=",
            0.0,
        ),
    ]


def notes(runs: dict) -> str:
    t = table(runs)
    lines = [
        "Means over seeds; greedy answers. ECE / Brier / AUROC of each confidence against the "
        "correctness of the greedy answer; ideal = the exact posterior of that answer.",
        "",
        "| arm | family | format | accuracy | confidence | ECE | Brier | AUROC |",
        "|---|---|---|---|---|---|---|---|",
    ]
    arms = [arm for arm in ("start", *ARMS) if arm in t]
    for arm in arms:
        for family, entry in t[arm].items():
            for conf in CONFIDENCES:
                if conf not in entry:
                    continue
                s = entry[conf]
                lines.append(
                    f"| {arm} | {family} | {entry['format']:.3f} | {s['accuracy']:.3f} | "
                    f"{conf} | {s['ece']:.3f} | {s['brier']:.3f} | {s['auroc']:.3f} |"
                )
    # The start's votes (measured in FULL too) were never printed.
    voted = [(arm, f, e) for arm in arms[1:] for f, e in t[arm].items() if "votes" in e]
    lines.append("")
    if voted:
        lines += [
            "| arm | family | single | majority | weighted | max-conf. | Bayes acc | Bayes Brier |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for arm, family, entry in voted:
            v, b = entry["votes"], entry["bayes"]
            lines.append(
                f"| {arm} | {family} | {v['single']:.3f} | {v['majority']:.3f} | "
                f"{v['weighted']:.3f} | {v['max_confidence']:.3f} | {b['accuracy']:.3f} | "
                f"{b['brier']:.3f} |"
            )
    else:  # no voting measured: the Bayes answerer (the same questions for every arm) alone
        lines += ["| family | Bayes acc | Bayes Brier |", "|---|---|---|"]
        for family, entry in t["start"].items():
            b = entry["bayes"]
            lines.append(f"| {family} | {b['accuracy']:.3f} | {b['brier']:.3f} |")
    return "\n".join(lines)


PANELS = (
    ("rlcr", "verbalized", "RLCR: stated confidence"),
    ("rlvr", "verbalized", "RLVR: stated confidence"),
    ("rlvr", "answer_prob", "RLVR: answer-token probability"),
    ("rlvr", "probe", "RLVR + post-hoc probe"),
)


def pooled_bins(per_seed: list[dict], family: str, conf: str):
    """Reliability bins pooled over seeds (count-weighted)."""
    count = np.zeros(calibration.NUM_BINS)
    conf_sum, acc_sum = np.zeros_like(count), np.zeros_like(count)
    for result in per_seed:
        bins = result[family]["bins"][conf]
        c = np.asarray(bins["count"])
        count += c
        conf_sum += np.nan_to_num(np.asarray(bins["confidence"])) * c
        acc_sum += np.nan_to_num(np.asarray(bins["accuracy"])) * c
    with np.errstate(invalid="ignore", divide="ignore"):
        return conf_sum / count, acc_sum / count, count


def plot(runs: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    t = table(runs)
    families = list(t["start"])
    # The panels of what was measured: every arm measures the same families.
    panels = [p for p in PANELS if p[0] in t and p[1] in t[p[0]][families[0]]]
    fig, axes = plt.subplots(
        len(families),
        len(panels),
        figsize=(3.2 * len(panels), 3.2 * len(families)),
        squeeze=False,
    )
    centres = (np.arange(calibration.NUM_BINS) + 0.5) / calibration.NUM_BINS
    for row, family in enumerate(families):
        for col, (arm, conf, title) in enumerate(panels):
            ax = axes[row, col]
            mean_conf, acc, count = pooled_bins(runs[arm], family, conf)
            keep = count > 0
            ax.bar(
                centres[keep], acc[keep], width=0.09, color="tab:blue", alpha=0.8, label="accuracy"
            )
            ax.plot(
                mean_conf[keep],
                acc[keep],
                "o",
                color="tab:red",
                ms=3,
                label="(confidence, accuracy)",
            )
            ax.plot([0, 1], [0, 1], "k--", lw=0.8)
            s = t[arm][family][conf]
            ax.set_title(
                f"{title}\n{family}: ECE {s['ece']:.3f}, AUROC {s['auroc']:.2f}", fontsize=8
            )
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.set_xlabel("confidence", fontsize=8)
            if col == 0:
                ax.set_ylabel("accuracy in bin", fontsize=8)
    axes[0, 0].legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
