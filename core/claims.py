"""Claims of a paper checked against measured numbers, shared by every method's experiment.

An experiment returns a `Report`: the measured metrics and a list of claims, each a sentence of
the paper (or of our reading of it), what we measured for it, and the comparison that decides
whether it holds. `launch.reproduce` prints and saves them; tests assert `holds`.

Two kinds of claim:
- `IntervalClaim` (the protocol for new experiments): a direction and a margin on a bootstrap
  interval over at least 3 seeds or splits (`core.stats`), usually of paired differences. It
  holds only if the whole interval clears the margin, so noise alone cannot make it hold:
  `IntervalClaim.beats` (A - B > m), `.no_worse` (A - B > -m), `.at_least` (A > t),
  `.at_most` (A < t).
- `Claim`: one measured number against a threshold (the older experiments).
Both render through `measured_text`, `target_text` and `n`, so tables mix them.

A claim the paper does not make (ours, kept as a row beside the paper's) is labelled in its text
with the word "exploratory" (or "diagnostic": a check that the test itself is fair), and counted
apart (`tally`): "7 of 9 claims hold (exploratory rows, counted apart: 1 of 2)".
"""

import dataclasses
import operator
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from core import stats
from core.errors import ConfigError

_OPS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}


@dataclasses.dataclass
class Claim:
    text: str  # what the paper (or this baseline) says, in one sentence
    metric: str  # the name of the measured number
    measured: float
    op: str  # one of >=, <=, >, <
    target: float

    @property
    def holds(self) -> bool:
        return bool(_OPS[self.op](self.measured, self.target))

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "holds": self.holds}

    def measured_text(self) -> str:
        return f"{self.measured:.4g}"

    def target_text(self) -> str:
        return f"{self.op} {self.target:g}"

    @property
    def n(self) -> int | None:  # how many seeds/splits the number rests on: not recorded
        return None


# form: (the end of the interval that must clear the threshold, the margin's sign in it). The
# low end must lie above the threshold, the high end below it.
_FORMS = {
    "beats": ("low", 1.0),  # A - B: low > m
    "no_worse": ("low", -1.0),  # A - B: low > -m
    "at_least": ("low", 1.0),  # A: low > t
    "at_most": ("high", 1.0),  # A: high < t
}


@dataclasses.dataclass
class IntervalClaim:
    """A direction and a margin on an interval over seeds or splits (see the module docstring).

    Build with the constructors, which compute the interval from per-seed numbers keyed by seed
    (or split id); `from_dict` reads one back from a report or results file."""

    text: str
    metric: str  # what the interval is of, e.g. "copy/exact_match" or "auroc: csnn - gcn"
    form: str  # one of _FORMS
    margin: float  # m for beats / no_worse, t for at_least / at_most
    interval: stats.Interval

    def __post_init__(self):
        if self.form not in _FORMS:
            raise ConfigError(f"claim form={self.form!r}; expected one of: {', '.join(_FORMS)}")
        if isinstance(self.interval, Mapping):
            self.interval = stats.Interval.from_dict(self.interval)

    @classmethod
    def beats(cls, text, metric, a: Mapping, b: Mapping, margin: float, **kw) -> "IntervalClaim":
        """A beats B by at least `margin`: the interval of paired A - B lies above `margin`."""
        diff = stats.paired_interval(a, b, what=metric, **kw)
        return cls(text, metric, "beats", margin, diff)

    @classmethod
    def no_worse(cls, text, metric, a: Mapping, b: Mapping, margin: float, **kw):
        """A is no worse than B within `margin`: the interval of paired A - B lies above
        -`margin`."""
        diff = stats.paired_interval(a, b, what=metric, **kw)
        return cls(text, metric, "no_worse", margin, diff)

    @classmethod
    def at_least(cls, text, metric, values: Mapping | Sequence, target: float, **kw):
        """A is at least `target`: the interval of A's mean lies above it."""
        return cls(text, metric, "at_least", target, stats.interval(values, what=metric, **kw))

    @classmethod
    def at_most(cls, text, metric, values: Mapping | Sequence, target: float, **kw):
        """A is at most `target`: the interval of A's mean lies below it."""
        return cls(text, metric, "at_most", target, stats.interval(values, what=metric, **kw))

    @property
    def threshold(self) -> float:
        return _FORMS[self.form][1] * self.margin

    @property
    def holds(self) -> bool:
        if _FORMS[self.form][0] == "low":
            return bool(self.interval.low > self.threshold)
        return bool(self.interval.high < self.threshold)

    @property
    def n(self) -> int:
        return self.interval.n

    def measured_text(self) -> str:
        return str(self.interval)

    def target_text(self) -> str:
        end = _FORMS[self.form][0]
        return f"{end} {'>' if end == 'low' else '<'} {self.threshold:g}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "interval",
            "text": self.text,
            "metric": self.metric,
            "form": self.form,
            "margin": self.margin,
            "interval": self.interval.to_dict(),
            "holds": self.holds,
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "IntervalClaim":
        return cls(d["text"], d["metric"], d["form"], d["margin"], d["interval"])


def claim_from_dict(d: Mapping) -> "Claim | IntervalClaim":
    """Either kind of claim from its `to_dict()` (the "holds" entry is recomputed, not read)."""
    if d.get("kind") == "interval":
        return IntervalClaim.from_dict(d)
    return Claim(d["text"], d["metric"], d["measured"], d["op"], d["target"])


_EXPLORATORY = re.compile(r"\b(exploratory|diagnostic)\b", re.IGNORECASE)


def is_exploratory(claim) -> bool:
    """Whether `claim` is labelled exploratory or diagnostic in its text (not the paper's;
    counted apart)."""
    return bool(_EXPLORATORY.search(claim.text))


@dataclasses.dataclass(frozen=True)
class Tally:
    held: int  # the paper's claims (every claim not labelled exploratory)
    total: int
    held_exploratory: int
    total_exploratory: int

    def text(self) -> str:
        """ "held of total claims hold", then the exploratory rows' count if there are any."""
        out = f"{self.held} of {self.total} claims hold"
        if self.total_exploratory:
            out += (
                f" (exploratory rows, counted apart: {self.held_exploratory} of "
                f"{self.total_exploratory})"
            )
        return out


def tally(claims) -> Tally:
    """The paper's claims held and counted, and the exploratory rows apart."""
    claims = list(claims)
    paper = [c.holds for c in claims if not is_exploratory(c)]
    explored = [c.holds for c in claims if is_exploratory(c)]
    return Tally(sum(paper), len(paper), sum(explored), len(explored))


def verdict_lines(claims: Iterable) -> list[str]:
    """One line per claim for a terminal: "holds" or "NO", its text and what was measured."""
    return [f"{'holds' if c.holds else 'NO   '}  {c.text}: {c.measured_text()}" for c in claims]


def power(form: str, mean: float, sd: float, n: int, margin: float, trials: int = 2000) -> float:
    """The chance that a claim of `form` with `margin` holds (its bootstrap interval's end past
    the threshold, as `core.stats.interval` computes it) when its n values (per seed, or paired
    differences for beats / no_worse) are normal with `mean` and `sd`. Monte Carlo, seeded: what
    a pilot's spread says about a claim before the run."""
    if form not in _FORMS:
        raise ConfigError(f"claim form={form!r}; expected one of: {', '.join(_FORMS)}")
    end, sign = _FORMS[form]
    draws = np.random.default_rng(0).normal(mean, sd, size=(trials, n))
    ends = [getattr(stats.interval(d, seed=i), end) for i, d in enumerate(draws)]
    held = [e > sign * margin if end == "low" else e < sign * margin for e in ends]
    return float(np.mean(held))


@dataclasses.dataclass
class Report:
    method: str
    claims: list  # of Claim and IntervalClaim
    metrics: dict[str, Any]  # everything measured, JSON-serialisable
    wall_seconds: float = 0.0
    command: str = ""  # how to run it again
    notes: str = ""
    figures: list[str] = dataclasses.field(default_factory=list)  # paths of PNGs it wrote
    # The per-seed raw numbers and config the claims were derived from (`core.results`): what
    # `launch.reproduce` saves and `--from_results` reads back. None for older experiments; a
    # list when the experiment has several parts, each its own record and run name
    # ("full", "full_code", ...: the experiment's RESULT_RUNS).
    results: dict | list[dict] | None = None

    @classmethod
    def on_protocol(cls, *, method, claims, results, quick=False, command=None, **fields):
        """An experiment-protocol report: each claim's interval is a metric, and the command
        reruns the experiment (`launch.reproduce`, `--quick` for a quick run) unless given."""
        quick_flag = " --quick" if quick else ""
        return cls(
            method=method,
            claims=claims,
            metrics={c.metric: c.interval.to_dict() for c in claims},
            command=command or f"python -m launch.reproduce --methods={method}{quick_flag}",
            results=results,
            **fields,
        )

    @classmethod
    def from_record(cls, record, *, claims_from_results, table, plots, workdir, quick=False):
        """The report of one protocol record: its claims re-derived by
        `claims_from_results(record)` first (which may refuse an unfinished grid before any
        figure is drawn), each figure `plots[name](record, path)` drawn as `workdir/name`, and
        `table(record)` printed (`launch.reproduce` prints only the claims) and kept as notes."""

        def plot(r, folder):
            paths = {name: os.path.join(folder, name) for name in plots}
            for name, draw in plots.items():
                draw(r, paths[name])
            return list(paths.values())

        return cls.from_records(
            [record],
            claims_from_results=claims_from_results,
            table=table,
            plot=plot,
            workdir=workdir,
            quick=quick,
        )

    @classmethod
    def from_records(cls, records, *, claims_from_results, table, plot, workdir, quick=False):
        """One report of a method's protocol records (e.g. a first study and its re-test), as
        `from_record` for each: every record's claims re-derived first, then `plot(record,
        workdir)` draws its figures (returns their paths), and the tables are printed and kept
        as notes. `results` is the record, or the list when there are several."""
        claims = [c for r in records for c in claims_from_results(r)]
        os.makedirs(workdir, exist_ok=True)
        figures = [f for r in records for f in plot(r, workdir)]
        notes = "\n\n".join(table(r) for r in records)
        print(notes, flush=True)
        return cls.on_protocol(
            method=records[0]["method"],
            claims=claims,
            results=records if len(records) > 1 else records[0],
            quick=quick,
            notes=notes,
            figures=figures,
        )

    @property
    def all_hold(self) -> bool:
        return all(c.holds for c in self.claims)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "all_hold": self.all_hold,
            "claims": [c.to_dict() for c in self.claims],
            "metrics": self.metrics,
            "wall_seconds": self.wall_seconds,
            "command": self.command,
            "notes": self.notes,
            "figures": self.figures,
        }

    def markdown(self) -> str:
        lines = [
            f"## {self.method}",
            "",
            "| claim | metric | measured [interval] | n | target | holds |",
            "|---|---|---|---|---|---|",
        ]
        for c in self.claims:
            mark = "yes" if c.holds else "**no**"
            n = "" if c.n is None else c.n
            lines.append(
                f"| {c.text} | {c.metric} | {c.measured_text()} | {n} | {c.target_text()} "
                f"| {mark} |"
            )
        lines += ["", f"Wall time: {self.wall_seconds:.0f} s. Command: `{self.command}`"]
        if self.notes:
            lines += ["", self.notes]
        lines += [f"\n![{os.path.basename(f)}]({os.path.basename(f)})" for f in self.figures]
        return "\n".join(lines) + "\n"
