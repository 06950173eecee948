"""Soft thinking on a pretrained LM (SmolLM2-135M-Instruct, Q4_1): the paper's own setting,
training-free; the toy task model (`experiment.py`) stays the second setting.

Problems (`problems.py`) are generated and checked by code on a ladder of difficulty levels.
The level is chosen on VALIDATION problems only: greedy accuracy of every level of
`Setting.levels` on `num_validation` validation problems, and `core.selection` takes the level
nearest the middle (50 %) of the 20-80 % band; if no level lies in the band the record says so
(`validation.in_band` false: a negative result, the band is not widened) and the nearest level
is still run. The decode length is set from the chosen level's validation greedy lengths
(`max_new_tokens`). The chosen level's TEST problems (other questions: hash split) are cut into
`test_splits` disjoint splits; per split (decoding key 1000 + split) every decoder at the
paper's settings, untuned (`evaluation.DECODERS`), with the chat prompt and the " answer"
delimiter of `pretrained_eval.py`: greedy once, the stochastic decoders `samples` times
(pass@1 = mean over samples, pass@k unbiased), ROUGE-L of each chain to the greedy chain, the
JS probe on vanilla soft and the logit lens at greedy branch points. One row per split: the
claims are IntervalClaims paired over splits (`claims_from_results`).

Claims and margins, written before the first full run (module constants). They are the toy's
claims; the margins are the toy's except the two pass@1 equivalences (0.05, not 0.02/0.03):
the paper's own differences between these decoders are a few points on benchmarks of hundreds of
problems, and with tens of problems per split here the binomial standard error of one split's
pass@1 difference is 0.05-0.1 (README: sizing), so a 0.02 margin would be undecidable by design.
The quick run (a smoke check: one level, 3 splits of 6 problems, greedy and the soft probe)
asserts the probe direction and two pipeline checks (QUICK_*), which fail for a random-init
model (README).

    python -m methods.soft_thinking.experiment_pretrained   # the full pretrained part alone
"""

import dataclasses
import math
import os
import sys

import jax
import numpy as np

from core import cache, results, selection
from core.claims import IntervalClaim, verdict_lines
from methods.soft_thinking import evaluation, pretrained_eval, problems

MODEL = "smollm2-135m-instruct"
BAND = (0.20, 0.80)  # validation greedy accuracy of the chosen level (the band)
VALIDATION_SEED, TEST_SEED = 0, 0
SPLIT_KEY = 1000  # decoding key of split s: PRNGKey(SPLIT_KEY + s)
LENGTH_QUANTILE = 0.9  # max_new_tokens: this quantile of validation greedy lengths, rounded up
LENGTH_ROUND = 32

# Margins (fixed before the first full run; module docstring).
PROBE_MARGIN = 0.05  # nats, as the toy
PROBE_RATIO = 0.25  # as the toy
SOFT_GREEDY_MARGIN = 0.05  # toy 0.02 (module docstring)
ROUGE_MARGIN = 0.10  # as the toy
GUMBEL_SAMPLE_MARGIN = 0.05  # toy 0.03 (module docstring)
GUMBEL_SOFT_MARGIN = 0.02  # as the toy
# Quick smoke checks. A working pipeline: the model ends with the delimiter on most greedy
# decodes (94-97 % on validation problems) and gets some single-digit sums right (19 % on
# validation: of 16 problems per split, P(none right) = 0.81^16 = 3 %); a random-init model, a
# wrong prompt, delimiter or parser gives 0 for both.
QUICK_DELIMITER_RATE = 0.5  # greedy decodes that emit " answer"
QUICK_GREEDY_FLOOR = 0.03  # greedy pass@1 on add_1d: above 0, at least one right per split


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    levels: tuple[str, ...]  # the ladder searched on validation
    num_validation: int  # validation problems per level
    validation_max_new_tokens: int  # the validation decodes' cap (and max_new_tokens' cap)
    test_splits: int
    per_split: int  # test problems per split
    samples: int  # decodes per problem of each stochastic decoder
    decoders: tuple[str, ...]  # stochastic decoders run (greedy always)
    probe_tokens: int  # soft steps the JS probe covers (from the first)
    lens_limit: int  # branch points per split for the logit lens (0: none)
    dtype: str = "float32"
    fixed_max_new_tokens: int = 0  # 0: from the validation lengths


# Sized to ~90 minutes on the 2 shared CPU cores (README: sizing): ~210 decoded tokens/s for
# every kind at batch 32-64 in float32 (bfloat16 is slower on this CPU), the JS probe ~3.3x a
# plain step; 120 test problems x (greedy + 4 x 16 samples) x <= max_new_tokens steps.
FULL = Setting(
    "full",
    levels=problems.LEVELS,
    num_validation=32,
    validation_max_new_tokens=256,
    test_splits=5,
    per_split=24,
    samples=16,
    decoders=evaluation.STOCHASTIC,
    probe_tokens=64,
    lens_limit=32,
)
# The quick run's smoke check (~2 minutes with loading): the simple end of the ladder only (its
# validation accuracy still measured and recorded), greedy and the soft probe.
QUICK = Setting(
    "quick",
    levels=("add_1d",),
    num_validation=16,
    validation_max_new_tokens=128,
    test_splits=3,
    per_split=16,
    samples=1,
    decoders=(),
    probe_tokens=32,
    lens_limit=0,
    fixed_max_new_tokens=128,
)


def load_lm(setting: Setting) -> pretrained_eval.ChatLM:
    from core import pretrained

    model = pretrained.load(
        MODEL, dtype=setting.dtype, max_len=setting.validation_max_new_tokens + 256
    )
    return pretrained_eval.ChatLM(model.cfg, jax.device_put(model.params), model.tokenizer)


def max_new_tokens_from(lengths, cap: int) -> int:
    """LENGTH_QUANTILE of the validation greedy lengths, rounded up to LENGTH_ROUND, <= cap."""
    quantile = float(np.quantile(np.asarray(lengths), LENGTH_QUANTILE))
    return int(min(cap, math.ceil(quantile / LENGTH_ROUND) * LENGTH_ROUND))


def choose_level(accuracy: dict[str, float]) -> dict:
    """The level nearest the band's middle by validation greedy accuracy (`core.selection`)."""
    middle = sum(BAND) / 2
    scores = selection.ValidationScores(
        "validation/greedy_accuracy_nearness_to_band_middle",
        {(level,): {0: -abs(acc - middle)} for level, acc in accuracy.items()},
    )
    level = selection.select({"level": tuple(accuracy)}, scores, rule="max").point["level"]
    return {"level": level, "in_band": bool(BAND[0] <= accuracy[level] <= BAND[1])}


def validate(lm, setting: Setting) -> dict:
    """Validation greedy accuracy and lengths per level, the chosen level, max_new_tokens."""
    accuracy, lengths = {}, {}
    for level in setting.levels:
        batch = problems.draw(level, "validation", setting.num_validation, VALIDATION_SEED)
        acc, lens = lm.greedy_accuracy(
            batch, max_new_tokens=setting.validation_max_new_tokens, rng=jax.random.PRNGKey(0)
        )
        accuracy[level], lengths[level] = acc, [int(n) for n in lens]
        print(f"   validation {level}: greedy accuracy {acc:.3f}", flush=True)
    chosen = choose_level(accuracy)
    max_new = setting.fixed_max_new_tokens or max_new_tokens_from(
        lengths[chosen["level"]], setting.validation_max_new_tokens
    )
    return {**chosen, "accuracy": accuracy, "lengths": lengths, "max_new_tokens": max_new}


def measure(workdir: str, *, quick: bool = False, lm=None, setting: Setting | None = None):
    """The pretrained part's results record ("quick_pretrained" / "full_pretrained"). `lm`:
    a ChatLM to use instead of loading MODEL (the tests' tiny model, a planted break)."""
    setting = setting or (QUICK if quick else FULL)
    lm = lm or load_lm(setting)
    code = results.source_hash(results.run_sources("soft_thinking"))
    root = os.path.join(workdir, "cache_pretrained")
    base = {"setting": dataclasses.asdict(setting), "model": MODEL, "cfg": repr(lm.cfg)}

    def run_cached(part, compute):
        return cache.cached(compute, config={**base, "part": part}, code=code, root=root)

    validation = run_cached("validation", lambda: validate(lm, setting))
    level, max_new = validation["level"], validation["max_new_tokens"]
    print(
        f"-- soft_thinking pretrained: level {level} (in band: {validation['in_band']}), "
        f"max_new_tokens {max_new}",
        flush=True,
    )
    test = problems.draw(level, "test", setting.test_splits * setting.per_split, TEST_SEED)
    run_setting = dataclasses.replace(setting, fixed_max_new_tokens=max_new)
    rows = []
    for split in range(setting.test_splits):
        batch = test[split * setting.per_split : (split + 1) * setting.per_split]
        key = jax.random.PRNGKey(SPLIT_KEY + split)
        row = run_cached(
            f"split {split} {level} {max_new}",
            lambda batch=batch, key=key: pretrained_eval.split_row(lm, batch, key, run_setting),
        )
        print(f"   split {split}: greedy pass@1 {row['greedy/pass@1']:.3f}", flush=True)
        rows.append({"split": split, **row})
    return results.record(
        "soft_thinking",
        f"{setting.name}_pretrained",
        config={
            "quick": setting.name == "quick",
            "model": MODEL,
            "setting": dataclasses.asdict(setting),
            "band": list(BAND),
            "delimiter": pretrained_eval.DELIMITER,
            "instruction": pretrained_eval.INSTRUCTION,
            "decoders": {k: d._asdict() for k, d in evaluation.DECODERS.items()},
        },
        rows=rows,
        validation=validation,
    )


def claims_from_results(record: dict) -> list[IntervalClaim]:
    """The pretrained part's claims, paired over test splits (quick: the smoke checks)."""
    rows = record["rows"]

    def splits(metric):
        return results.by_seed(rows, metric, key="split")

    name = "SmolLM2"
    claims = [
        IntervalClaim.beats(
            f"{name} probe: JS to the top-2 input exceeds JS to the top-1 input",
            f"{name} soft: js_top2 - js_top1 (nats)",
            splits("soft/js_top2"),
            splits("soft/js_top1"),
            PROBE_MARGIN,
        )
    ]
    if record["config"]["quick"]:
        return claims + [
            IntervalClaim.at_least(
                f"smoke: {name} greedy ends with the delimiter {pretrained_eval.DELIMITER!r}",
                f"{name} greedy/delimiter_rate",
                splits("greedy/delimiter_rate"),
                QUICK_DELIMITER_RATE,
            ),
            IntervalClaim.at_least(
                f"smoke: {name} greedy answers some single-digit sums",
                f"{name} greedy/pass@1",
                splits("greedy/pass@1"),
                QUICK_GREEDY_FLOOR,
            ),
        ]
    return claims + [
        IntervalClaim.at_most(
            f"{name} probe: JS(top-1) / JS(top-2) is small",
            f"{name} soft/js_ratio",
            splits("soft/js_ratio"),
            PROBE_RATIO,
        ),
        IntervalClaim.no_worse(
            f"{name}: vanilla soft no worse than greedy",
            f"{name} pass@1: soft - greedy",
            splits("soft/pass@1"),
            splits("greedy/pass@1"),
            SOFT_GREEDY_MARGIN,
        ),
        IntervalClaim.no_worse(
            f"{name}: greedy no worse than vanilla soft",
            f"{name} pass@1: greedy - soft",
            splits("greedy/pass@1"),
            splits("soft/pass@1"),
            SOFT_GREEDY_MARGIN,
        ),
        IntervalClaim.beats(
            f"{name}: vanilla soft's chain is closer to greedy's than token sampling's",
            f"{name} ROUGE-L to greedy: soft - sample",
            splits("soft/rouge_l_greedy"),
            splits("sample/rouge_l_greedy"),
            ROUGE_MARGIN,
        ),
        IntervalClaim.no_worse(
            f"{name}: Gumbel soft thinking recovers token sampling's pass@1",
            f"{name} pass@1: gumbel - sample",
            splits("gumbel/pass@1"),
            splits("sample/pass@1"),
            GUMBEL_SAMPLE_MARGIN,
        ),
        IntervalClaim.beats(
            f"{name}: Gumbel beats vanilla soft on pass@{record['config']['setting']['samples']}",
            f"{name} pass@k: gumbel - soft",
            splits(f"gumbel/pass@{top_k(record)}"),
            splits(f"soft/pass@{top_k(record)}"),
            GUMBEL_SOFT_MARGIN,
        ),
    ]


def top_k(record: dict) -> int:
    """The largest k of pass@k the record has (PASS_K up to its samples)."""
    samples = record["config"]["setting"]["samples"]
    return max(k for k in evaluation.PASS_K if k <= samples)


if __name__ == "__main__":
    from core import compile_cache

    compile_cache.enable()
    out = sys.argv[1] if len(sys.argv) > 1 else "results/workdirs/soft_thinking"
    saved = results.save(measure(out, quick=False))
    print(f"saved {saved}")
    print(
        "\n".join(
            verdict_lines(claims_from_results(results.load("soft_thinking", "full_pretrained")))
        )
    )
