"""core.claims: interval claims hold on the interval's bound, not on the mean; both kinds render
and round-trip through JSON."""

import json
import os

import pytest

from core import stats
from core.claims import Claim, IntervalClaim, Report, claim_from_dict, power, tally
from core.errors import ConfigError


def iv(low, high, mean=None, n=5):
    mean = (low + high) / 2 if mean is None else mean
    return stats.Interval(mean, 0.01, low, high, n, 0.95, 1000, 0)


@pytest.mark.parametrize(
    "form, margin, interval, holds",
    [
        # A beats B by at least 0.02: the lower bound must clear +0.02; a mean of 0.05 is not
        # enough when the interval reaches down to 0.01.
        ("beats", 0.02, iv(0.03, 0.07), True),
        ("beats", 0.02, iv(0.01, 0.09, mean=0.05), False),
        # No worse within 0.02: the lower bound must clear -0.02.
        ("no_worse", 0.02, iv(-0.01, 0.01), True),
        ("no_worse", 0.02, iv(-0.03, 0.05, mean=0.01), False),
        ("at_least", 0.9, iv(0.91, 0.99), True),
        ("at_least", 0.9, iv(0.89, 0.99, mean=0.95), False),
        # At most 0.6: the upper bound must stay below it.
        ("at_most", 0.6, iv(0.45, 0.55), True),
        ("at_most", 0.6, iv(0.45, 0.65, mean=0.5), False),
    ],
)
def test_forms_decide_on_the_interval_bound(form, margin, interval, holds):
    claim = IntervalClaim("text", "metric", form, margin, interval)
    assert claim.holds is holds


def test_beats_pairs_the_seeds_and_can_fail():
    a = {0: 0.95, 1: 0.90, 2: 0.97, 3: 0.93}
    b = {3: 0.90, 2: 0.94, 1: 0.87, 0: 0.92}  # 0.03 better on every seed, listed in reverse
    assert IntervalClaim.beats("A beats B", "acc", a, b, 0.02).holds
    assert not IntervalClaim.beats("A beats B by a lot", "acc", a, b, 0.05).holds
    # Unpaired means differ by 0.03 too, but the seeds' spread (0.87-0.97) would hide it.
    assert IntervalClaim.no_worse("B no worse than A", "acc", b, a, 0.05).holds
    assert not IntervalClaim.no_worse("B no worse than A", "acc", b, a, 0.02).holds


def test_exploratory_rows_are_counted_apart_from_the_papers_claims():
    claims = [
        IntervalClaim("the paper's", "m", "at_least", 0.9, iv(0.91, 0.99)),
        IntervalClaim("the paper's, failing", "m", "at_least", 0.9, iv(0.5, 0.6)),
        IntervalClaim("v2, Exploratory (ours): at 8x", "m", "at_least", 0.9, iv(0.91, 0.99)),
        Claim("v2, diagnostic: a threshold row", "m", 0.1, ">", 0.5),
        Claim("unexploratory is not the label", "m", 0.7, ">", 0.5),
    ]
    counted = tally(claims)
    assert (counted.held, counted.total) == (2, 3)
    assert (counted.held_exploratory, counted.total_exploratory) == (1, 2)
    assert counted.text() == ("2 of 3 claims hold (exploratory rows, counted apart: 1 of 2)")
    assert tally(claims[:2]).text() == "1 of 2 claims hold"


def test_a_claims_power_follows_its_form_its_margin_and_the_spread():
    TRIALS = 200  # each trial is a 10,000-resample interval; the bounds below hold at 200
    # Values far past the threshold: the claim (almost) always holds; at the threshold, about
    # as often as the interval's end clears it, well under half; at_most mirrors at_least.
    assert power("at_least", 0.99, 0.01, 3, 0.9, trials=TRIALS) > 0.99
    assert power("at_least", 0.9, 0.05, 5, 0.9, trials=TRIALS) < 0.2
    assert power("at_most", 0.5, 0.01, 3, 0.6, trials=TRIALS) > 0.99
    assert power("at_most", 0.62, 0.01, 3, 0.6, trials=TRIALS) < 0.01
    # no_worse's threshold is -margin: a true difference of 0 clears -0.1 when the spread is small
    assert power("no_worse", 0.0, 0.01, 3, 0.1, trials=TRIALS) > 0.99
    assert power("beats", 0.0, 0.01, 3, 0.1, trials=TRIALS) < 0.01
    # More seeds, more power at a fixed effect (beats at the margin plus 1.5 sd).
    assert power("beats", 0.25, 0.1, 8, 0.1, trials=TRIALS) > power(
        "beats", 0.25, 0.1, 3, 0.1, trials=TRIALS
    )
    with pytest.raises(ConfigError, match="form='larger'"):
        power("larger", 0.0, 1.0, 3, 0.0, trials=TRIALS)


def test_unknown_form_is_a_one_line_error():
    with pytest.raises(ConfigError, match="form='better'.*beats, no_worse, at_least, at_most"):
        IntervalClaim("t", "m", "better", 0.0, iv(0, 1))


def test_both_kinds_render_and_round_trip_through_json():
    old = Claim("copy learned", "copy/exact_match", 0.97, ">=", 0.95)
    new = IntervalClaim.at_most("parity fails", "parity/acc", {0: 0.5, 1: 0.52, 2: 0.48}, 0.6)
    report = Report(method="lm", claims=[old, new], metrics={})
    data = json.loads(json.dumps(report.to_dict()))
    assert data["all_hold"] is True
    back = [claim_from_dict(c) for c in data["claims"]]
    assert back[0] == old and back[1] == new and back[1].holds
    text = report.markdown()
    assert "| copy learned | copy/exact_match | 0.97 |  | >= 0.95 | yes |" in text
    row = next(line for line in text.splitlines() if "parity fails" in line)
    # mean [low, high], n, and the bound that is compared with its threshold
    assert f"| {new.interval} | 3 | high < 0.6 | yes |" in row
    assert str(new.interval).startswith("0.5 [0.48")


def test_a_protocol_report_lists_each_claims_interval_and_its_rerun_command():
    claim = IntervalClaim.at_least("x high", "x", {0: 0.9, 1: 0.95, 2: 0.97}, 0.5)
    full = Report.on_protocol(method="m", claims=[claim], results={"run": "full"})
    quick = Report.on_protocol(method="m", claims=[claim], results=None, quick=True, notes="n")
    assert full.metrics == {"x": claim.interval.to_dict()} and full.results == {"run": "full"}
    assert full.command == "python -m launch.reproduce --methods=m"
    assert quick.command == "python -m launch.reproduce --methods=m --quick" and quick.notes == "n"


def test_a_report_from_a_record_refuses_before_drawing_and_keeps_its_table(tmp_path, capsys):
    record = {"method": "m", "run": "full", "rows": [{"seed": s, "x": 0.9} for s in range(3)]}

    def claims(r):
        by_seed = {row["seed"]: row["x"] for row in r["rows"]}
        return [IntervalClaim.at_least("x high", "x", by_seed, 0.5)]

    def draw(r, path):
        with open(path, "w") as f:
            f.write(str(len(r["rows"])))

    def table(r):
        return f"{len(r['rows'])} rows"

    report = Report.from_record(
        record,
        claims_from_results=claims,
        table=table,
        plots={"f.png": draw},
        workdir=str(tmp_path),
    )
    assert report.figures == [str(tmp_path / "f.png")] and (tmp_path / "f.png").read_text() == "3"
    assert report.notes == "3 rows" and "3 rows" in capsys.readouterr().out
    assert report.method == "m" and report.results is record and report.all_hold

    def unfinished(r):
        raise ConfigError("grid not finished")

    with pytest.raises(ConfigError, match="grid not finished"):
        Report.from_record(
            record, claims_from_results=unfinished, table=table, plots={"g.png": draw},
            workdir=str(tmp_path),
        )  # fmt: skip
    assert not (tmp_path / "g.png").exists()


def test_a_report_from_two_records_holds_both_in_order(tmp_path, capsys):
    """A first study and its re-test: every claim of each, each record's figures, both tables."""
    first, retest = (
        {"method": "m", "run": run, "rows": [{"seed": s, "x": x} for s in range(3)]}
        for run, x in (("full", 0.9), ("full_v2", 0.1))
    )

    def claims(r):
        by_seed = {row["seed"]: row["x"] for row in r["rows"]}
        return [IntervalClaim.at_least(f"{r['run']}: x high", "x", by_seed, 0.5)]

    def plot(r, folder):
        path = os.path.join(folder, f"{r['run']}.png")
        open(path, "w").close()
        return [path]

    report = Report.from_records(
        [first, retest],
        claims_from_results=claims,
        table=lambda r: f"table {r['run']}",
        plot=plot,
        workdir=str(tmp_path / "w"),
    )
    assert [c.text for c in report.claims] == ["full: x high", "full_v2: x high"]
    assert [c.holds for c in report.claims] == [True, False]
    assert report.results == [first, retest]
    assert [os.path.basename(f) for f in report.figures] == ["full.png", "full_v2.png"]
    assert (
        report.notes == "table full\n\ntable full_v2" and "table full_v2" in capsys.readouterr().out
    )
