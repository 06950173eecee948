"""A quick run's claims beside the committed full run's: what `launch.reproduce --quick` prints.

A quick run is a smoke check at reduced size (fewer seeds, steps and grid points; some margins
smaller), so its verdicts say that the pipeline runs, not whether a claim reproduces. The full
runs' figures are committed (`methods/<slug>/results/full*.json`) and re-derived in seconds
(`launch.reproduce --from_results`), so each method's table shows both, claim by claim, and the
totals count them separately.

Claims are paired by what identifies them, never by position: the same sentence and metric;
failing that, the same metric compared the same way (a quick run's wording may name its own
size, "L = 8" for "L = 16"), or the same sentence compared the same way (a metric may name the
size, "len32" for "len64"). A key pairs two claims only if it is unique among the unpaired
claims of both runs; everything else gets a row of its own, with the other run's cells marked.
"""

import dataclasses
import textwrap

from core.claims import IntervalClaim, Report, tally

SMOKE = "smoke check at reduced size, not a reproduction"
INTRO = (
    "Each method's claims: the committed full run's figures (re-derived from "
    "methods/<slug>/results/, nothing retrained) beside this quick run's. The quick run is a "
    f"{SMOKE} (fewer seeds, steps and grid points; some margins smaller): its columns show that "
    "the pipeline runs end to end; whether a claim reproduces is the full run's column."
)
NO_FULL_RUN = "no full run"
NOT_IN_FULL = "not in full run"
NOT_IN_QUICK = "not in quick run"
COLUMNS = ("measured [interval]", "n", "target", "holds")


def comparison(claim) -> str:
    """How a claim compares its number: an IntervalClaim's form, a Claim's operator."""
    return claim.form if isinstance(claim, IntervalClaim) else claim.op


# In order of preference; see the module docstring.
_KEYS = (
    lambda c: (c.text, c.metric),
    lambda c: (c.metric, comparison(c)),
    lambda c: (c.text, comparison(c)),
)


@dataclasses.dataclass(frozen=True)
class Row:
    full: object | None  # a Claim or IntervalClaim; None: not in the full run
    quick: object | None  # None: not in the quick run


def _unique(claims: list, indices: list[int], key) -> dict:
    """{key: index} for the keys that occur once among claims[indices]."""
    seen: dict = {}
    for i in indices:
        seen.setdefault(key(claims[i]), []).append(i)
    return {k: found[0] for k, found in seen.items() if len(found) == 1}


def pair_claims(full: list, quick: list) -> list[Row]:
    """One row per claim of either run: the full run's in its order (each with its quick
    counterpart, if any), then the quick run's claims that pair with none."""
    full_of_quick: dict[int, int] = {}
    for key in _KEYS:
        paired = set(full_of_quick.values())
        free_full = _unique(full, [i for i in range(len(full)) if i not in paired], key)
        free_quick = _unique(quick, [j for j in range(len(quick)) if j not in full_of_quick], key)
        for k, j in free_quick.items():
            if k in free_full:
                full_of_quick[j] = free_full[k]
    quick_of_full = {i: j for j, i in full_of_quick.items()}
    rows = [
        Row(claim, quick[quick_of_full[i]] if i in quick_of_full else None)
        for i, claim in enumerate(full)
    ]
    return rows + [Row(None, c) for j, c in enumerate(quick) if j not in full_of_quick]


@dataclasses.dataclass(frozen=True)
class SideBySide:
    """One method: this quick run's report and the committed full run's (None: none, and why)."""

    quick: Report
    full: Report | None
    why_no_full: str = ""

    @property
    def method(self) -> str:
        return self.quick.method

    @property
    def rows(self) -> list[Row]:
        return pair_claims(self.full.claims if self.full else [], self.quick.claims)


def _cells(claim, missing: str, no: str) -> tuple[str, ...]:
    if claim is None:
        return (missing, "", "", "")
    n = "" if claim.n is None else str(claim.n)
    return (claim.measured_text(), n, claim.target_text(), "yes" if claim.holds else no)


def table_rows(side: SideBySide, no: str = "NO") -> tuple[list[tuple[str, ...]], list[str]]:
    """(claim, full cells..., quick cells...) per row, and a footnote for each pair whose quick
    wording differs from the full run's (the claim column shows the full run's)."""
    rows, notes = [], []
    missing_full = NOT_IN_FULL if side.full is not None else NO_FULL_RUN
    for row in side.rows:
        text = (row.full or row.quick).text
        if row.full is not None and row.quick is not None and row.quick.text != row.full.text:
            notes.append(f"[q{len(notes) + 1}] the quick run's wording: {row.quick.text}")
            text += f" [q{len(notes)}]"
        full = _cells(row.full, missing_full, no)
        rows.append((text, *full, *_cells(row.quick, NOT_IN_QUICK, no)))
    return rows, notes


def _header(side: SideBySide) -> str:
    return (
        f"{side.method}: committed full run | this quick run ({SMOKE}; "
        f"{side.quick.wall_seconds:.0f} s)"
    )


def format_table(rows, header) -> str:
    rows = [header, *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(f"{v:<{w}}" for v, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _group(run: str) -> tuple[str, ...]:
    """One run's column headers, the first naming the run."""
    return (f"{run}: {COLUMNS[0]}", *COLUMNS[1:])


def text_table(side: SideBySide) -> str:
    rows, notes = table_rows(side)
    header = ("claim", *_group("full run"), *_group("quick (smoke)"))
    lines = [f"== {_header(side)}", format_table(rows, header), *notes]
    if side.full is None:
        lines.append(f"{NO_FULL_RUN}: {side.why_no_full}")
    return "\n".join(lines)


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def markdown_table(side: SideBySide, level: int = 3) -> str:
    rows, notes = table_rows(side, no="**no**")
    columns = ("claim", *_group("full run"), *_group("quick (smoke)"))
    lines = [
        f"{'#' * level} {_header(side)}",
        "",
        f"| {' | '.join(columns)} |",
        "|" + "---|" * len(columns),
        *(f"| {' | '.join(_md(v) for v in row)} |" for row in rows),
        "",
        *(f"{_md(note)}  " for note in notes),
    ]
    if side.full is not None:
        lines.append(f"Full-run figures: {side.full.notes}")
    else:
        lines.append(f"{NO_FULL_RUN}: {side.why_no_full}")
    return "\n".join(lines) + "\n"


def counts(sides: list[SideBySide]) -> str:
    """Two lines: the committed full runs' held / total, then this quick run's."""
    with_full = [s for s in sides if s.full is not None]
    full = tally(c for s in with_full for c in s.full.claims).text()
    quick = tally(c for s in sides for c in s.quick.claims).text()
    without = [s.method for s in sides if s.full is None]
    seconds = sum(s.quick.wall_seconds for s in sides)
    absent = f" ({NO_FULL_RUN}: {', '.join(without)})" if without else ""
    return (
        f"full runs (committed): {full} over {_methods(len(with_full))}{absent}\n"
        f"this quick run (smoke, reduced size): {quick} over {_methods(len(sides))}; "
        f"{seconds:.0f} s"
    )


def _methods(n: int) -> str:
    return f"{n} method" + ("" if n == 1 else "s")


def text_summary(sides: list[SideBySide]) -> str:
    """Every method's table, then the two counts (the last lines of a quick run)."""
    intro = textwrap.fill(INTRO, 100)
    return "\n\n".join([intro, *(text_table(s) for s in sides), counts(sides)])


def markdown_summary(sides: list[SideBySide]) -> str:
    counted = counts(sides).replace("\n", "  \n")
    parts = [
        "## All claims: committed full runs beside this quick run",
        INTRO,
        *(markdown_table(s) for s in sides),
        counted,
    ]
    return "\n\n".join(parts) + "\n"
