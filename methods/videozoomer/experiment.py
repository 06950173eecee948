"""VideoZoomer's claims at CPU scale: the glance-then-zoom agent against glance-only and uniform
sampling, and the ablations of its training (cold start, RL, reflection data, tool bonus).

Arms (3 seeds; the training arms through `runs.trained`, each seed's cold start shared where
the arms share it):
- full: cold start on oracle + reflection trajectories (half each), then GRPO with the bonus;
- sft_only, no_cold_start, no_reflection, no_bonus: the paper's ablations;
- glance_only, uniform_eq, uniform_2x: the perfect reader (`oracle.reader_accuracy`) on the
  glance's 32 frames, on as many uniform frames as the full agent used on average (its own
  seed's mean, rounded), and on twice that; the same held-out videos. A reader that perceives
  every frame it gets without error: a learned reader on those frames can only do worse.

No hyperparameter is chosen here: every arm trains with the same fixed settings
(`configs/videozoomer.py`: the official GRPO settings where they transfer, our plan's reward
and bonus 0.1; sizes set to fit the CPU budget), none tuned for any arm, so nothing is selected
on validation. The claims and margins below were written before the first full run:
- the agent beats glance-only on needle and on count questions by >= 0.2 accuracy each;
- it beats uniform sampling at equal frames (overall accuracy, margin 0);
- SFT and RL are both needed: full beats SFT-only (margin 0) and RL without cold start
  (margin 0.2);
- without reflection data the policy settles at about one zoom: its zooms per episode in
  [0.75, 1.25], and the full agent zooms more (by > 0.2 per episode);
- without the bonus, tool use collapses: the share of episodes with a zoom drops below the full
  agent's by > 0.25.
The quick run (tests) trains the full arm alone at a smaller size and asserts it beats
glance-only on needle questions.
"""

from ml_collections import ConfigDict

from configs import videozoomer as vz_config
from core import experiment_runner
from core.claims import IntervalClaim, Report
from core.experiment_runner import Arm, ClaimSpec, Experiment
from methods.videozoomer import runs
from methods.videozoomer.report import plot

SEEDS = (0, 1, 2)
TRAINED = ("full", "sft_only", "no_cold_start", "no_reflection", "no_bonus")
QUICK_SIZE = dict(sft=250, rl=5, videos=8, group=4, eval_examples=150)


def training_config(arm: str, seed: int, quick: bool):
    c = vz_config.get_config(f"arm={arm},size=small")
    c.seed = seed
    if quick:
        q = QUICK_SIZE
        c.sft.steps = q["sft"] if c.sft.steps else 0
        c.train.steps = c.sft.steps + (q["rl"] if arm != "sft_only" else 0)
        c.train.batch_size = q["videos"]
        c.grpo.group_size = q["group"]
        c.eval.num_examples = q["eval_examples"]
    return c


def config_of(arm: Arm, point: dict, seed: int, quick: bool):
    del point
    if arm.name in runs.READERS:  # a reader on the full agent's videos and frame usage
        agent = training_config("full", seed, quick).to_dict()
        return {"reader": runs.READERS[arm.name], "agent": agent}
    return training_config(arm.name, seed, quick)


def run_arm(config, run_dir: str) -> dict:
    workdir = run_dir.rsplit("/runs/", 1)[0]
    if isinstance(config, dict):
        agent = ConfigDict(config["agent"])
        return runs.rows(runs.trained(agent, workdir), config["reader"])
    return runs.rows(runs.trained(config, workdir))


def _claims() -> tuple[ClaimSpec, ...]:
    acc = "test/accuracy"
    return (
        ClaimSpec("beats", "the agent beats glance-only on needle questions by >= 0.2",
                  "test/needle/accuracy", "full", 0.2, baseline="glance_only"),
        ClaimSpec("beats", "the agent beats glance-only on count questions by >= 0.2",
                  "test/count/accuracy", "full", 0.2, baseline="glance_only", in_quick=False),
        ClaimSpec("beats", "the agent beats uniform sampling at equal frames",
                  acc, "full", 0.0, baseline="uniform_eq", in_quick=False),
        ClaimSpec("beats", "SFT + RL beats SFT alone", acc, "full", 0.0, baseline="sft_only",
                  in_quick=False),
        ClaimSpec("beats", "SFT + RL beats RL without cold start by >= 0.2", acc, "full", 0.2,
                  baseline="no_cold_start", in_quick=False),
        ClaimSpec("at_least", "without reflection data: about one zoom (>= 0.75)",
                  "test/zooms", "no_reflection", 0.75, in_quick=False),
        ClaimSpec("at_most", "without reflection data: about one zoom (<= 1.25)",
                  "test/zooms", "no_reflection", 1.25, in_quick=False),
        ClaimSpec("beats", "reflection data: more zooms than without (by > 0.2)",
                  "test/zooms", "full", 0.2, baseline="no_reflection", in_quick=False),
        ClaimSpec("beats", "without the tool bonus tool use collapses (zoomed share -0.25)",
                  "test/zoomed", "full", 0.25, baseline="no_bonus", in_quick=False),
    )  # fmt: skip


EXPERIMENT = Experiment(
    slug="videozoomer",
    arms=tuple(Arm(name) for name in (*TRAINED, *runs.READERS)),
    quick_arms=(Arm("full"), Arm("glance_only")),
    seeds=SEEDS,
    config_of=config_of,
    run=run_arm,
    claims=_claims(),
)


def measure(workdir: str, *, quick: bool = False) -> dict:
    return experiment_runner.measure(EXPERIMENT, workdir, quick=quick)


def claims_from_results(record: dict) -> list[IntervalClaim]:
    return experiment_runner.claims(EXPERIMENT, record)


def run(workdir: str, *, quick: bool = False) -> Report:
    return experiment_runner.report(EXPERIMENT, workdir, quick=quick, plot=plot)
