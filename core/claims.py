"""Claims of a paper checked against measured numbers, shared by every method's experiment.

An experiment returns a `Report`: the measured metrics and a list of `Claim`s, each a sentence of
the paper (or of our reading of it), the number we measured for it, and the comparison that decides
whether it holds. `launch.reproduce` prints and saves them; tests assert `holds`.
"""

import dataclasses
import operator
import os
from typing import Any

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


@dataclasses.dataclass
class Report:
    method: str
    claims: list[Claim]
    metrics: dict[str, Any]  # everything measured, JSON-serialisable
    wall_seconds: float = 0.0
    command: str = ""  # how to run it again
    notes: str = ""
    figures: list[str] = dataclasses.field(default_factory=list)  # paths of PNGs it wrote

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
            "| claim | metric | measured | target | holds |",
            "|---|---|---|---|---|",
        ]
        for c in self.claims:
            mark = "yes" if c.holds else "**no**"
            lines.append(
                f"| {c.text} | {c.metric} | {c.measured:.4g} | {c.op} {c.target:g} | {mark} |"
            )
        lines += ["", f"Wall time: {self.wall_seconds:.0f} s. Command: `{self.command}`"]
        if self.notes:
            lines += ["", self.notes]
        lines += [f"\n![{os.path.basename(f)}]({os.path.basename(f)})" for f in self.figures]
        return "\n".join(lines) + "\n"
