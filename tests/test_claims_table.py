"""launch.claims_table: a quick run's claims beside the committed full run's, paired by what
identifies a claim (never by position), the missing ones marked, and the two runs counted
separately. Tiny hand-made reports: nothing is trained."""

from core.claims import Claim, IntervalClaim, Report
from launch import claims_table
from launch.claims_table import NO_FULL_RUN, NOT_IN_FULL, NOT_IN_QUICK, SideBySide


def at_least(text, metric, values, target=0.5):
    return IntervalClaim.at_least(text, metric, values, target)


def at_most(text, metric, values, target=0.5):
    return IntervalClaim.at_most(text, metric, values, target)


HIGH, LOW = [0.9, 0.95, 1.0], [0.1, 0.15, 0.2]  # at_least(0.5): holds / fails

# A full run shaped like the real ones: a wording that names the run's size (flow_mtp), a metric
# that names it (selective_rope), one metric under two comparisons (hybrid_online), one metric
# and comparison under two backbones (dupa), and claims the quick run does not measure.
FULL = [
    at_least("u beats no u by > 4 (L = 16)", "prefix: ptp - no_u", HIGH),
    at_least("copying is learned", "copy/exact_match", HIGH),
    at_least("parity is solved at the training length", "len64/accuracy", HIGH),
    at_least("slope >= 0.3", "ftrl/slope", HIGH),
    at_most("slope <= 0.7", "ftrl/slope", LOW),
    at_least("sincos: DUPA's FD is lower", "fd: dual - dupa", LOW),
    at_least("rope: DUPA's FD is lower", "fd: dual - dupa", HIGH),
    Claim("camel: DOIT is no worse", "camel/loss", 0.2, ">=", 0.5),
]
# The quick run lists its claims in another order.
QUICK = [
    at_least("DUPA's FD is lower than DDT-B's", "fd: ddt - dupa", HIGH),  # no full counterpart
    at_least("rope, 100 steps: DUPA's FD is lower", "fd: dual - dupa", HIGH),  # ambiguous
    at_most("slope <= 0.7", "ftrl/slope", HIGH),
    at_least("parity is solved at the training length", "len32/accuracy", LOW),
    at_least("copying is learned", "copy/exact_match", LOW),
    at_least("u beats no u by > 1 (L = 8)", "prefix: ptp - no_u", HIGH),
]


def texts(rows):
    return [(r.full and r.full.text, r.quick and r.quick.text) for r in rows]


def test_claims_pair_by_identity_not_by_position():
    rows = claims_table.pair_claims(FULL, QUICK)
    assert texts(rows) == [
        # the same metric compared the same way, in the quick run's own wording
        ("u beats no u by > 4 (L = 16)", "u beats no u by > 1 (L = 8)"),
        ("copying is learned", "copying is learned"),  # the same sentence and metric
        # the same sentence compared the same way, on the quick run's length
        ("parity is solved at the training length", "parity is solved at the training length"),
        ("slope >= 0.3", None),  # its metric's other comparison is not this one
        ("slope <= 0.7", "slope <= 0.7"),
        # Two full claims share the quick claim's metric and comparison: no guess, three rows.
        ("sincos: DUPA's FD is lower", None),
        ("rope: DUPA's FD is lower", None),
        ("camel: DOIT is no worse", None),
        (None, "DUPA's FD is lower than DDT-B's"),
        (None, "rope, 100 steps: DUPA's FD is lower"),
    ]
    # Every claim of either run is in exactly one row.
    assert sorted(id(r.full) for r in rows if r.full) == sorted(map(id, FULL))
    assert sorted(id(r.quick) for r in rows if r.quick) == sorted(map(id, QUICK))


def test_each_run_keeps_its_own_figures_and_verdicts_and_the_missing_are_marked():
    side = SideBySide(Report("m", QUICK, {}, 12.0), Report("m", FULL, {}))
    rows, notes = claims_table.table_rows(side)
    by_text = {row[0]: row for row in rows}
    copying = by_text["copying is learned"]
    # (claim, full: measured, n, target, holds, quick: measured, n, target, holds)
    assert copying[1:] == (
        str(FULL[1].interval), "3", "low > 0.5", "yes",
        str(QUICK[4].interval), "3", "low > 0.5", "NO",
    )  # fmt: skip
    assert by_text["camel: DOIT is no worse"][1:] == (
        "0.2", "", ">= 0.5", "NO", NOT_IN_QUICK, "", "", "",
    )  # fmt: skip
    assert by_text["DUPA's FD is lower than DDT-B's"][1:5] == (NOT_IN_FULL, "", "", "")
    # A pair worded differently: the full run's sentence, the quick run's in a footnote.
    assert by_text["u beats no u by > 4 (L = 16) [q1]"][8] == "yes"
    assert notes == ["[q1] the quick run's wording: u beats no u by > 1 (L = 8)"]


def test_a_method_without_a_full_run_says_so_in_every_row():
    quick = Report("x", [at_least("a", "a", HIGH), at_least("b", "b", LOW)], {}, 3.0)
    side = SideBySide(quick, None, why_no_full="x: no results file methods/x/results/full.json")
    rows, _ = claims_table.table_rows(side)
    assert [row[1:5] for row in rows] == [(NO_FULL_RUN, "", "", "")] * 2
    assert [row[8] for row in rows] == ["yes", "NO"]
    text = claims_table.text_table(side)
    assert text.splitlines()[-1] == f"{NO_FULL_RUN}: x: no results file methods/x/results/full.json"
    assert "smoke check at reduced size" in text.splitlines()[0]


def test_the_two_runs_are_counted_separately():
    sides = [
        SideBySide(Report("m", QUICK, {}, 12.0), Report("m", FULL, {})),
        SideBySide(Report("x", [at_least("a", "a", HIGH)], {}, 3.0), None, "x: none"),
    ]
    full_held = sum(c.holds for c in FULL)
    quick_held = sum(c.holds for c in QUICK) + 1
    assert (full_held, quick_held) != (len(FULL), len(QUICK) + 1)  # a count that can go wrong
    text = claims_table.text_summary(sides)
    assert text.splitlines()[-2:] == [
        f"full runs (committed): {full_held} of {len(FULL)} claims hold over 1 method "
        f"({NO_FULL_RUN}: x)",
        f"this quick run (smoke, reduced size): {quick_held} of {len(QUICK) + 1} claims hold "
        "over 2 methods; 15 s",
    ]
    # The smoke-run caveat once above the tables, and in each table's header line.
    assert text.count(claims_table.INTRO[:40]) == 1
    headers = [line for line in text.splitlines() if line.startswith("== ")]
    assert [h.split(":")[0] for h in headers] == ["== m", "== x"]
    assert all("(smoke check at reduced size, not a reproduction" in h for h in headers)
    markdown = claims_table.markdown_summary(sides)
    assert f"{full_held} of {len(FULL)} claims hold over 1 method" in markdown
    assert markdown.count("| claim | full run: measured [interval] |") == 2
    assert f"| copying is learned | {FULL[1].interval} | 3 | low > 0.5 | yes |" in markdown
