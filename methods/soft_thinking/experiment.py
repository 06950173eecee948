"""Soft thinking's experiment: five decoders on a task model trained to an imperfect level (this
module), and on a pretrained LM, training-free (`experiment_pretrained`: the paper's own
setting; `run` runs both, each its own results record, `claims_from_results` reads either).

Per seed (model init and training stream; SEEDS): the decoder of `configs/soft_thinking.py`
is trained through `core.train` on the shuffled modular sum (`task.py`), with its greedy
accuracy on VALIDATION prompts measured every `check_every` steps; the step count is chosen by
`core.selection` as the check whose validation greedy accuracy is nearest the middle of the
50-75 % band (training stops once validation accuracy is past PAST_BAND: later checks only move
away from the band). The chosen model is then decoded on TEST prompts (other multisets than
training and validation) by greedy, token sampling, vanilla soft, Dirichlet and Gumbel soft
thinking at the paper's settings, untuned (`evaluation.DECODERS`), 16 samples per prompt.

Measured per seed: pass@1 (mean over the 16 samples) and pass@k (k = 1, 2, 4, 8, 16; the
unbiased estimator), valid-trace rate, ROUGE-L of each decode's thinking chain (its post-noise
top-1 ids) against the greedy chain, distinct chains per prompt, the JS probe on vanilla soft
thinking (JS of the next-token distribution after the soft input vs after its top-1 token and
after its top-2 token alone), and the logit lens at greedy branch points (0.6/0.4 mixture of the
top-2 embeddings vs each alone, top-3 overlap per layer).

Claims, fixed before any result was seen (IntervalClaim on per-seed values, paired by seed):
- probe: mean JS to the top-2 input exceeds mean JS to the top-1 input by more than
  PROBE_MARGIN nats, and the ratio JS(top-1) / JS(top-2) is below PROBE_RATIO;
- vanilla soft ~ greedy: soft pass@1 minus greedy accuracy lies within +-SOFT_GREEDY_MARGIN
  (two no_worse claims), and soft's ROUGE-L to the greedy chain exceeds token sampling's by
  more than ROUGE_MARGIN;
- Gumbel pass@1 no worse than token sampling's within GUMBEL_SAMPLE_MARGIN; Gumbel pass@16
  above vanilla soft's by more than GUMBEL_SOFT_MARGIN.
Reported, not asserted (`report.py`, with the README's table and the figure): Dirichlet beside
Gumbel; whether Gumbel beats token sampling.
The quick run (smaller model, fewer prompts; greedy and vanilla soft only, no logit lens)
asserts the probe claims, greedy no worse than soft, and, in place of soft no worse than
greedy (which fails in the full run too), the smoke check that greedy beats chance.
"""

import dataclasses
import os

import jax
import numpy as np

from configs import soft_thinking as soft_config
from core import cache, results, selection, train
from core.claims import IntervalClaim, Report
from methods.soft_thinking import (
    evaluation,
    experiment_pretrained,
    make,
    make_task,
    model_config,
    report,
)
from methods.soft_thinking.evaluation import PASS_K, STOCHASTIC

SEEDS = (0, 1, 2)
BAND = (0.50, 0.75)  # the imperfect level the task model is trained to (validation greedy)
PAST_BAND = 0.85  # validation greedy accuracy past which training stops
SAMPLES = 16
VALIDATION_SEED, TEST_SEED = 0, 0  # prompt sets (the splits' hash keeps them apart)

# The claims' margins (fixed before the first run; module docstring).
PROBE_MARGIN = 0.05  # nats (JS is at most ln 2 = 0.693)
PROBE_RATIO = 0.25
SOFT_GREEDY_MARGIN = 0.02
ROUGE_MARGIN = 0.10
GUMBEL_SAMPLE_MARGIN = 0.03
GUMBEL_SOFT_MARGIN = 0.02
# Quick run only: greedy accuracy above chance by two binomial standard errors of a chance-level
# model's accuracy pooled over 3 seeds x 64 test prompts (2 sqrt(p (1 - p) / 192) = 0.05 at
# p = 1/7), so a model that learned nothing cannot reach it (untrained, it is below chance).
QUICK_LEARNED_MARGIN = 0.05


@dataclasses.dataclass(frozen=True)
class Setting:
    size: str  # configs/soft_thinking.py size
    check_every: int  # training steps between validation checks
    max_checks: int
    num_validation: int  # validation prompts for the step choice
    num_test: int  # test prompts, each decoded SAMPLES times
    lens_limit: int  # branch points for the logit lens (0: no logit lens)
    decoders: tuple[str, ...] = STOCHASTIC  # decoded 16 times per prompt (greedy always once)


FULL = Setting(
    "full", check_every=50, max_checks=16, num_validation=256, num_test=512, lens_limit=512
)
QUICK = Setting(
    "quick",
    check_every=50,
    max_checks=4,
    num_validation=64,
    num_test=64,
    lens_limit=0,
    decoders=("soft",),  # what the quick claims read: the probe and soft ~ greedy
)


def seed_config(setting: Setting, seed: int):
    config = soft_config.get_config(f"size={setting.size}")
    config.seed = seed
    config.train.steps = setting.check_every * setting.max_checks
    return config


def greedy_accuracy(cfg, params, task, terms, rng) -> float:
    out = evaluation.decode(
        cfg, params, task, terms, decoder=evaluation.DECODERS["greedy"], rng=rng
    )
    return float(evaluation.score(task, terms, out)["correct"].mean())


def train_selected(config, setting: Setting, devices) -> dict:
    """Train in checks of `check_every` steps; the chosen step's params (on validation only),
    the validation curve and the training losses."""
    session = train.init(config, make(config), devices=devices)
    cfg, task = model_config(config), make_task(config)
    terms = task.prompts("validation", setting.num_validation, VALIDATION_SEED)
    rng = jax.random.PRNGKey(config.seed)
    curve, snapshots, losses = {}, {}, []
    for check in range(1, setting.max_checks + 1):
        rows = session.train(setting.check_every)
        losses.append(float(np.mean([row["loss"] for row in rows])))
        step = check * setting.check_every
        snapshots[step] = jax.device_get(session.state.params)
        curve[step] = greedy_accuracy(cfg, snapshots[step], task, terms, rng)
        print(f"   step {step}: validation greedy accuracy {curve[step]:.3f}", flush=True)
        if curve[step] >= PAST_BAND:
            break
    middle = sum(BAND) / 2
    scores = selection.ValidationScores(
        "validation/greedy_accuracy_nearness_to_band_middle",
        {(step,): {config.seed: -abs(acc - middle)} for step, acc in curve.items()},
    )
    chosen = selection.select({"steps": tuple(curve)}, scores, rule="max")
    step = chosen.point["steps"]
    return {
        "params": snapshots[step],
        "steps": step,
        "steps_on_edge": chosen.edges.get("steps"),
        "validation_curve": {str(s): a for s, a in curve.items()},
        "losses": losses,
    }


def evaluate_decoders(cfg, params, task, setting: Setting, seed: int) -> dict:
    """Every decoder's test metrics for one model, as a flat row."""
    terms = task.prompts("test", setting.num_test, TEST_SEED)
    key = jax.random.PRNGKey(1000 + seed)
    greedy = evaluation.decode(
        cfg, params, task, terms, decoder=evaluation.DECODERS["greedy"], rng=key
    )
    greedy_chains = evaluation.chains(greedy)[0]
    greedy_scores = evaluation.score(task, terms, greedy)
    row = {
        "greedy/pass@1": float(greedy_scores["correct"].mean()),
        "greedy/valid_trace": float(greedy_scores["valid_trace"].mean()),
    }
    for index, name in enumerate(STOCHASTIC):
        if name not in setting.decoders:
            continue
        out = evaluation.decode(
            cfg,
            params,
            task,
            terms,
            decoder=evaluation.DECODERS[name],
            rng=jax.random.fold_in(key, index + 1),
            samples=SAMPLES,
        )
        scores = evaluation.score(task, terms, out)
        correct_B = scores["correct"].sum(0)
        for k in PASS_K:
            row[f"{name}/pass@{k}"] = float(evaluation.pass_at_k(SAMPLES, correct_B, k).mean())
        row[f"{name}/valid_trace"] = float(scores["valid_trace"].mean())
        chains_SB = evaluation.chains(out)
        row[f"{name}/rouge_l_greedy"] = evaluation.agreement_with(greedy_chains, chains_SB)
        row[f"{name}/distinct_chains"] = evaluation.distinct_chains(chains_SB)
    # Vanilla soft thinking is deterministic until the delimiter: one decode per prompt probes it.
    probed = evaluation.decode(
        cfg, params, task, terms, decoder=evaluation.DECODERS["soft"], rng=key, probe=True
    )
    probe = evaluation.probe_summary(probed)
    row |= {f"soft/{k}": v for k, v in probe.items()}
    row["soft/js_ratio"] = probe["js_top1"] / probe["js_top2"]
    if not setting.lens_limit:
        return row
    sequences = np.concatenate([task.prompt_tokens(terms), greedy["completion_SBN"][0]], axis=1)
    lens = evaluation.logit_lens(
        cfg,
        params,
        task,
        sequences,
        temperature=evaluation.DECODERS["soft"].temperature,
        limit=setting.lens_limit,
    )
    row.update(evaluation.lens_metrics(lens))
    return row


def run_seed(setting: Setting, seed: int, devices) -> dict:
    config = seed_config(setting, seed)
    trained = train_selected(config, setting, devices)
    cfg, task = model_config(config), make_task(config)
    row = evaluate_decoders(cfg, trained["params"], task, setting, seed)
    val = trained["validation_curve"][str(trained["steps"])]
    return {
        "row": {"seed": seed, "steps": trained["steps"], "validation/greedy": val, **row},
        "steps_on_edge": trained["steps_on_edge"],
        "validation_curve": trained["validation_curve"],
        "losses": trained["losses"],
    }


def measure(workdir: str, *, quick: bool = False, seeds=SEEDS) -> dict:
    setting = QUICK if quick else FULL
    code = results.code_version("soft_thinking")
    # One device: a batch of 64 gains nothing from the test suite's 8 fake devices.
    devices = jax.devices()[:1]
    rows, curves, edges, losses = [], {}, {}, {}
    for seed in seeds:
        config = seed_config(setting, seed)
        print(f"-- soft_thinking seed {seed}: up to {config.train.steps} steps", flush=True)
        key_config = {"config": config.to_dict(), "setting": dataclasses.asdict(setting)}
        out = cache.cached(
            lambda seed=seed: run_seed(setting, seed, devices),
            config=key_config,
            # the files a run reads (not this one's claims, nor report.py's tables)
            code=results.source_hash(results.run_sources("soft_thinking")),
            root=os.path.join(workdir, "cache"),
        )
        rows.append(out["row"])
        curves[str(seed)] = out["validation_curve"]
        edges[str(seed)] = out["steps_on_edge"]
        losses[str(seed)] = out["losses"]
    return results.record(
        "soft_thinking",
        "quick" if quick else "full",
        config={
            "seeds": list(seeds),
            "quick": quick,
            "setting": dataclasses.asdict(setting),
            "band": list(BAND),
            "samples": SAMPLES,
            "decoders": {k: d._asdict() for k, d in evaluation.DECODERS.items()},
            "train": seed_config(setting, seeds[0]).to_dict(),  # seed 0's; the seed varies
        },
        rows=rows,
        code=code,
        validation_curves=curves,
        steps_on_edge=edges,
        losses=losses,
    )


# Two settings, each its own record in a full run: the toy task model ("full", this module) and
# the pretrained LM ("full_pretrained", experiment_pretrained), re-derived by --from_results once
# its file exists. A quick run is one record: the toy's, with the pretrained smoke record inside
# (record["pretrained"]).
RESULT_RUNS = ("full",) + (
    ("full_pretrained",) if os.path.exists(results.path("soft_thinking", "full_pretrained")) else ()
)


def claims_from_results(record: dict) -> list[IntervalClaim]:
    """The claims of one record: the toy's (and in a quick record the pretrained smoke checks
    too), or the pretrained setting's (run "full_pretrained")."""
    if record["run"].endswith("_pretrained"):
        return experiment_pretrained.claims_from_results(record)
    claims = toy_claims(record)
    if "pretrained" in record:
        claims += experiment_pretrained.claims_from_results(record["pretrained"])
    return claims


def toy_claims(record: dict) -> list[IntervalClaim]:
    """The toy setting's claims (quick: the probe, soft ~ greedy, learned)."""
    rows = record["rows"]
    quick = record["config"].get("quick")

    def seeds(metric):
        return results.by_seed(rows, metric)

    claims = [
        IntervalClaim.beats(
            "probe: JS to the top-2 input exceeds JS to the top-1 input",
            "soft: js_top2 - js_top1 (nats)",
            seeds("soft/js_top2"),
            seeds("soft/js_top1"),
            PROBE_MARGIN,
        ),
        IntervalClaim.at_most(
            "probe: JS(top-1) / JS(top-2) is small",
            "soft/js_ratio",
            seeds("soft/js_ratio"),
            PROBE_RATIO,
        ),
        IntervalClaim.no_worse(
            "vanilla soft no worse than greedy",
            "pass@1: soft - greedy",
            seeds("soft/pass@1"),
            seeds("greedy/pass@1"),
            SOFT_GREEDY_MARGIN,
        )
        if not quick
        # Fails in the full run too (a documented negative result): the quick run, a smoke
        # check, checks instead that the task model learned at all.
        else IntervalClaim.beats(
            "smoke: the task model learned: greedy pass@1 above chance (1 / modulus)",
            "pass@1: greedy - chance",
            seeds("greedy/pass@1"),
            {
                seed: 1 / record["config"]["train"]["task"]["modulus"]
                for seed in seeds("greedy/pass@1")
            },
            QUICK_LEARNED_MARGIN,
        ),
        IntervalClaim.no_worse(
            "greedy no worse than vanilla soft",
            "pass@1: greedy - soft",
            seeds("greedy/pass@1"),
            seeds("soft/pass@1"),
            SOFT_GREEDY_MARGIN,
        ),
    ]
    if quick:
        return claims
    return claims + [
        IntervalClaim.beats(
            "vanilla soft's chain is closer to greedy's than token sampling's",
            "ROUGE-L to greedy: soft - sample",
            seeds("soft/rouge_l_greedy"),
            seeds("sample/rouge_l_greedy"),
            ROUGE_MARGIN,
        ),
        IntervalClaim.no_worse(
            "Gumbel soft thinking recovers token sampling's pass@1",
            "pass@1: gumbel - sample",
            seeds("gumbel/pass@1"),
            seeds("sample/pass@1"),
            GUMBEL_SAMPLE_MARGIN,
        ),
        IntervalClaim.beats(
            "Gumbel beats vanilla soft on pass@16",
            "pass@16: gumbel - soft",
            seeds("gumbel/pass@16"),
            seeds("soft/pass@16"),
            GUMBEL_SOFT_MARGIN,
        ),
    ]


def run(workdir: str, *, quick: bool = False) -> Report:
    """The toy setting, then the pretrained one (quick: its smoke record inside the toy's)."""
    record = measure(workdir, quick=quick)
    figure = os.path.join(workdir, "soft_thinking_pass_at_k.png")
    report.plot_pass_at_k(record, figure)
    pretrained = experiment_pretrained.measure(workdir, quick=quick)
    if quick:
        record["pretrained"] = pretrained
    claims = claims_from_results(record)
    if not quick:
        claims += claims_from_results(pretrained)
    return Report(
        method="soft_thinking",
        figures=[figure],
        claims=claims,
        metrics={**{c.metric: c.interval.to_dict() for c in claims}, **report.reported(record)},
        command="python -m launch.reproduce --methods=soft_thinking"
        + (" --quick" if quick else ""),
        results=record if quick else [record, pretrained],
    )
