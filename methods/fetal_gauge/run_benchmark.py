"""Run a model on a Fetal-Gauge style benchmark held on local disk and write its scorecard.

    python -m methods.fetal_gauge.run_benchmark --records R.json --images DIR --model M \\
        --out OUT [--size 64] [--tasks PI,VG] [--split test] [--seed 0] [--batch-size 64]

M is a stub (oracle, random, always-a, parse-failure: checks of the harness) or vlm:<workdir>
(the VLM trained by `core.train` into that workdir). The records' JSON format is
`local_data.load_records`'s. OUT gets the scorecard (scores.json, report.md, accuracy.png) and
predictions.jsonl (one line per question). `--demo DIR` writes a small phantom set in that
format and prints the command that scores it. Every bad input is one line on stderr, exit 2.
"""

import argparse
import json
import os
import sys

from core.errors import ConfigError
from methods.fetal_gauge import harness, scorecard, scoring, stubs
from methods.fetal_gauge.records import SPLITS
from methods.fetal_gauge.vocab import check_task

DEMO_PATIENTS = 30  # 6 test patients: about 240 questions (both styles), a few seconds to write


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage + message; we want one line
        raise ConfigError(f"fetal_gauge: run_benchmark: {message}")


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(
        prog="python -m methods.fetal_gauge.run_benchmark", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--records", help="the records' JSON (local_data format)")
    parser.add_argument("--images", help="the folder the records' image paths are relative to")
    parser.add_argument(
        "--model", default="random", help=f"{', '.join(stubs.STUB_NAMES)} or vlm:<workdir>"
    )
    parser.add_argument("--out", help="the folder for scores.json, report.md, accuracy.png")
    parser.add_argument("--size", type=int, default=64, help="images resized to size x size")
    parser.add_argument("--tasks", default="", help="comma-separated tasks (default: all)")
    parser.add_argument("--split", default="", help="score only this split (default: all)")
    parser.add_argument("--seed", type=int, default=0, help="stub and bootstrap seed")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--title", default="", help="the scorecard's title")
    parser.add_argument("--demo", metavar="DIR", help="write a small phantom set into DIR")
    return parser


def make_model(name: str, records, *, seed: int):
    """A stub by name, or the trained VLM of `vlm:<workdir>`."""
    if name.startswith("vlm:"):
        workdir = name[len("vlm:") :]
        if not os.path.isdir(workdir):
            raise ConfigError(f"fetal_gauge: model=vlm:{workdir}: no such workdir")
        try:
            from methods.fetal_gauge.model import load
        except ImportError as error:
            raise ConfigError(f"fetal_gauge: model=vlm: is not available ({error})") from None
        return load(workdir)
    return stubs.make_stub(name, records, seed=seed)


def select(records, *, tasks: str, split: str):
    """The records of the chosen tasks (comma-separated; "" = all) and split ("" = all)."""
    chosen = list(records)
    if tasks:
        wanted = {check_task(t.strip()) for t in tasks.split(",") if t.strip()}
        chosen = [r for r in chosen if r.task in wanted]
    if split:
        if split not in SPLITS:
            raise ConfigError(f"fetal_gauge: --split={split!r}; one of {', '.join(SPLITS)}")
        chosen = [r for r in chosen if r.split == split]
    if not chosen:
        raise ConfigError(f"fetal_gauge: --tasks={tasks!r} --split={split!r}: no record left")
    return chosen


def write_predictions(records, predictions, path: str) -> None:
    """One JSON line per question (qid, task, answer, predicted index, raw text): what a reader
    needs to look at the wrong and the invalid answers."""
    with open(path, "w") as f:
        for record, index, raw in zip(records, predictions.indices, predictions.raw, strict=True):
            row = {"qid": record.qid, "task": record.task, "answer_idx": record.answer_idx}
            f.write(json.dumps(row | {"predicted_idx": index, "raw": raw}) + "\n")


def write_demo(directory: str, *, seed: int) -> str:
    """A small phantom test set written as local data; returns the command that scores it."""
    from methods.fetal_gauge.local_data import write_records
    from methods.fetal_gauge.phantom_set import phantom_benchmark

    records = [r for r in phantom_benchmark(DEMO_PATIENTS, seed) if r.split == "test"]
    records_json = os.path.join(directory, "records.json")
    image_root = os.path.join(directory, "images")
    os.makedirs(image_root, exist_ok=True)
    write_records(records, records_json, image_root)
    print(f"wrote {len(records)} questions to {records_json} (images under {image_root})")
    return (
        f"python -m methods.fetal_gauge.run_benchmark --records {records_json} "
        f"--images {image_root} --model random --out {os.path.join(directory, 'scorecard')}"
    )


def run(args) -> dict:
    from methods.fetal_gauge.local_data import load_records

    for field in ("records", "images", "out"):
        if not getattr(args, field):
            raise ConfigError(f"fetal_gauge: run_benchmark: --{field} is required")
    if args.size < 1 or args.batch_size < 1:
        raise ConfigError(
            f"fetal_gauge: --size={args.size}, --batch-size={args.batch_size}; both at least 1"
        )
    records = load_records(args.records, args.images, size=args.size)
    records = select(records, tasks=args.tasks, split=args.split)
    model = make_model(args.model, records, seed=args.seed)
    predictions = harness.evaluate(model, records, batch_size=args.batch_size)
    scores = scoring.score(records, predictions.indices, seed=args.seed)
    scores["model"] = args.model
    scores["seconds"] = predictions.seconds
    title = args.title or f"Fetal-Gauge: {args.model} on {os.path.basename(args.records)}"
    paths = scorecard.write(scores, args.out, title=title)
    paths["predictions"] = os.path.join(args.out, "predictions.jsonl")
    write_predictions(records, predictions, paths["predictions"])
    print(scorecard.task_table(scores))
    rate = len(records) / max(predictions.seconds, 1e-9)
    print(f"{len(records)} questions in {predictions.seconds:.1f} s ({rate:.0f} questions/s)")
    print("wrote " + ", ".join(paths.values()))
    return scores


def main(argv: list[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
        if args.demo:
            print("run: " + write_demo(args.demo, seed=args.seed))
            return 0
        run(args)
        return 0
    except ConfigError as error:
        print(str(error).splitlines()[0] if str(error) else "fetal_gauge: error", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
