"""One cached unit of the experiment: an arm at one learning rate and seed, trained through
`core.train` and scored by Precision@1 on the validation and test queries.

    row = run(config, run_dir)   # config.exp.arm: an ARMS name; config.exp.queries per family

What each arm trains and which traces its queries hold at evaluation:

    baseline      embedder, no trace                     -
    tte_t         embedder, teacher traces               the teacher over the classifier's reading
    tte_s         tte_t's embedder (the same run)        the reasoner's greedy traces
    final_only    embedder, answer word only             teacher (final answer only)
    noisy_<rho>   embedder, traces corrupted at rho      teacher, corrupted at rho
    trace_only    embedder, the trace alone as query     teacher
    tte_u_mhsa    MHSA head on the frozen reasoner       the reasoner's greedy traces
    tte_u_pooler  attention pooler on its last layer     the reasoner's greedy traces

The plain-text part (`text`; its own experiment, `experiment_text`), on pairs no training query
asked about ("unseen": the split's own pair group) and on training pairs ("seen"):

    baseline_text  embedder, no trace                    -
    tte_t_text     embedder, teacher traces              the teacher (the query's own digits)
    tte_lm_text    tte_t_text's embedder (the same run)  SmolLM2's answers (`lm_traces`)

Shared trainings (the reasoner of a seed; tte_t's embedder, read again by tte_s) live in
`<workdir>/train/<key of their config>`: `core.train.run` resumes a finished run at its last
step, so a second arm reads the same weights instead of training them again.
"""

import os

import jax
import numpy as np
from ml_collections import ConfigDict

from configs import tte as tte_config
from core import cache, digits, results, train
from methods import tte
from methods.tte import embedder, examples, lm_traces, tasks, text, traces

ARMS = (
    "baseline",
    "tte_t",
    "tte_s",
    "final_only",
    "noisy_0.1",
    "noisy_0.3",
    "noisy_0.5",
    "trace_only",
    "tte_u_mhsa",
    "tte_u_pooler",
)
TEXT_ARMS = ("baseline_text", "tte_t_text", "tte_lm_text")
SPLITS = {"validation": tte.VALIDATION_SEED, "test": tte.TEST_SEED}
# The run cache's code key: the method's sources but those that only read numbers.
SOURCES = results.run_sources("tte", besides=(*results.READERS, "experiment_text.py"))


def role_config(size: str, seed: int, lr: float, role: str, **tte_fields) -> ConfigDict:
    """A training run's config: `configs/tte.py` at `size` and `role` (its steps), its seed and
    lr, tte fields set."""
    c = tte_config.get_config(f"size={size},role={role}")
    c.seed = seed
    c.optim.lr = lr
    c.train.eval_every = -1  # the experiment scores the final weights itself
    c.train.log_every = c.train.steps
    for name, value in tte_fields.items():
        setattr(c.tte, name, value)
    return c


def embedder_fields(arm: str) -> dict:
    if arm == "baseline":
        return dict(style="none")
    if arm in ("tte_t", "tte_s"):
        return dict(style="full")
    if arm == "final_only":
        return dict(style="final")
    if arm.startswith("noisy_"):
        return dict(style="full", rho=float(arm.removeprefix("noisy_")))
    if arm == "trace_only":
        return dict(style="full", trace_only=True)
    raise ValueError(f"tte: arm {arm!r} has no embedder of its own")


def _train(c: ConfigDict, root: str):
    """The final params of `c`'s run, trained in `<root>/train/<key>` (or read back there)."""
    code = results.source_hash(SOURCES)
    workdir = os.path.join(root, "train", cache.key(c, code))
    result = train.run(c, tte.make(c), workdir, devices=jax.devices()[:1])
    return workdir, jax.device_get(result.state.params)


def _sides(kind: str, q: examples.Queries, c: ConfigDict, clf, reasoner, seed: int):
    """The query sides of one family: teacher traces (kind "teacher") or the reasoner's."""
    fmt = tte.query_format(c)
    if kind == "reasoner":
        words = traces.reasoner(*reasoner, q)
    elif fmt.style == "none":
        words = [[] for _ in q.k]
    else:
        words = traces.teacher(
            q, traces.perceive(clf.params, q), style=fmt.style, rho=fmt.rho, seed=seed
        )
    return traces.query_sides(q, words, trace_only=fmt.trace_only), words


def score(embed_fn, params, c, kind: str, n: int, clf, reasoner=None) -> dict:
    """{"<split>/p1/<family>", ".../compositional", ".../mean"} and, for reasoner traces, the
    share equal to the teacher's on the true digits ("<split>/trace_exact")."""
    row = {}
    for split_name, seed in SPLITS.items():
        s = tasks.split(split_name)
        queries, sides, exact = {}, {}, []
        for family in tasks.FAMILIES:
            q = queries[family] = examples.eval_queries(s, family, n, seed)
            sides[family], words = _sides(kind, q, c, clf, reasoner, seed)
            if kind == "reasoner":
                truth = traces.teacher(q, q.shown, style="full", rho=0.0, seed=seed)
                exact += [a == b for a, b in zip(words, truth, strict=True)]
        p = embedder.precision(embed_fn, params, queries, sides, examples.gallery(s))
        row |= {f"{split_name}/p1/{f}": v for f, v in p.items()}
        row[f"{split_name}/p1/compositional"] = float(np.mean([p[f] for f in tasks.COMPOSITIONAL]))
        row[f"{split_name}/p1/mean"] = float(np.mean(list(p.values())))
        if exact:
            row[f"{split_name}/trace_exact"] = float(np.mean(exact))
    return row


def run_text(config, root: str) -> dict:
    """One text-part unit: the embedder (no trace, or teacher traces), scored on unseen and
    seen pairs of both splits; tte_lm_text reads SmolLM2's answers (and records their accuracy
    per pair group under the prompt chosen on training pairs)."""
    e = config.exp
    style = "none" if e.arm == "baseline_text" else "full"
    c = role_config(e.size, config.seed, config.optim.lr, "embedder", style=style, families="text")
    _, params = _train(c, root)
    fn = embedder.jitted(embedder.model_config(c))
    row, answers_of = {}, None
    if e.arm == "tte_lm_text":
        lm = lm_traces.answer_table(root)
        row |= {f"lm_accuracy/{g}": v for g, v in lm["accuracy"][lm["prompt"]].items()}
        row |= {f"lm_accuracy/{k}": v for k, v in lm["accuracy_by_family"].items()}
        row["lm_prompt_is_cot"] = float(lm["prompt"] == "cot")

        def answers_of(q):
            return [lm["answers"][q.family][text.digits(d)] for d in q.shown]

    for split_name, seed in SPLITS.items():
        s = tasks.split(split_name)
        for tag, group in (("unseen", split_name), ("seen", "train")):
            p = tte.text_precision(fn, params, s, group, e.queries, seed, style, answers_of)
            row |= {f"{split_name}/{tag}/{k}": v for k, v in p.items()}
    return row


def run(config, run_dir: str) -> dict:
    """One (arm, lr, seed) unit: train what the arm needs, score it on both splits."""
    e = config.exp
    root = os.path.dirname(os.path.dirname(run_dir))  # <workdir>/runs/<key> -> <workdir>
    if e.arm in TEXT_ARMS:
        return run_text(config, root)
    clf = digits.classifier(os.path.expanduser(config.tte.classifier_cache))
    if e.arm.startswith("tte_u") or e.arm == "tte_s":
        rc = role_config(e.size, config.seed, e.reasoner_lr, "reasoner")
        reasoner_dir, reasoner_params = _train(rc, root)
        reasoner = (embedder.model_config(rc), reasoner_params)
    if e.arm.startswith("tte_u"):
        head = e.arm.removeprefix("tte_u_")
        c = role_config(
            e.size, config.seed, config.optim.lr, "unified", head=head, reasoner=reasoner_dir
        )
        _, params = _train(c, root)
        fn = embedder.jitted(embedder.model_config(c), embedder.head_config(c))
        return score(fn, params, c, "reasoner", e.queries, clf, reasoner)
    c = role_config(e.size, config.seed, config.optim.lr, "embedder", **embedder_fields(e.arm))
    _, params = _train(c, root)
    fn = embedder.jitted(embedder.model_config(c))
    kind = "reasoner" if e.arm == "tte_s" else "teacher"
    return score(fn, params, c, kind, e.queries, clf, reasoner if kind == "reasoner" else None)
