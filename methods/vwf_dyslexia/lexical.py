"""Lexical decision on any list of (letter string, is_real_word) pairs, rendered as in training.

    python -m methods.vwf_dyslexia.lexical --workdir=/tmp/vwf --words=my_list.txt
    python -m methods.vwf_dyslexia.lexical --workdir=/tmp/vwf --words=my_list.txt \
        --font=STIXGeneral.ttf --seed=3

`--workdir` is a training run of `launch.train` (configs/vwf_dyslexia.py): its config.json and
newest good checkpoint are read. `--words` is a text file, one item a line: the string, white
space, then its label (1 / 0, real / pseudo, yes / no, true / false); blank lines and lines
starting with # are skipped. Strings are lowercase a-z (what the model was trained to read) and
must fit the image; anything else is refused with its line number. Each item is drawn in
`--font` (a font file among matplotlib's, `stimuli.FONTS` / `HELD_OUT_FONTS`) at the size and
place `--seed` and its index pick. Prints one line per item (string, label, the model's answer)
and the accuracy; `--json=PATH` writes them too.

`decide(cfg, params, pairs, ...)` is the same from Python, with an optional lesion
`gate_mask_LF` (`lesion.unit_masks`).
"""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np

from core.nn import vlm
from methods.vwf_dyslexia import answer_logits, lesion, stimuli, tasks

LABELS = {
    **dict.fromkeys(("1", "real", "yes", "true"), True),
    **dict.fromkeys(("0", "pseudo", "no", "false"), False),
}


def read_pairs(path: str) -> list[tuple[str, bool]]:
    """(string, is_real_word) per item line of `path` (module docstring's format)."""
    pairs = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if len(fields) != 2 or fields[1].lower() not in LABELS:
                raise ValueError(
                    f"{path}:{number}: expected '<string> <label>' with a label in "
                    f"{sorted(LABELS)}, got {line.strip()!r}"
                )
            pairs.append((fields[0], LABELS[fields[1].lower()]))
    if not pairs:
        raise ValueError(f"{path}: no items")
    return pairs


@functools.partial(jax.jit, static_argnums=0)
def _answers(cfg, params, batch, gate_mask_LF):
    """The token predicted at each example's (single) answer position [B]."""
    logits_BTV = answer_logits(cfg, params, batch, gate_mask_LF)
    position_B = jnp.argmax(batch["mask"], axis=1)
    return jnp.argmax(jnp.take_along_axis(logits_BTV, position_B[:, None, None], 1)[:, 0], -1)


def decide(
    cfg: vlm.VLMConfig,
    params,
    pairs,
    *,
    font: str = stimuli.FONTS[0],
    seed: int = 0,
    gate_mask_LF=None,
    batch_size: int = 64,
    jitter: float = 1.0,
) -> dict:
    """{"accuracy", "items": [{"string", "real", "answer"}]}: the model's lexical decision on
    each pair (answer "yes", "no", or the other token it predicted, which counts as wrong).
    jitter: the size and place randomness the model was trained at (config.data.jitter)."""
    for i, (text, real) in enumerate(pairs):  # refuse before any rendering or compiling
        if not isinstance(real, bool | np.bool_) or not text or set(text) - set(stimuli.LETTERS):
            raise ValueError(f"item {i} ({text!r}, {real!r}): need a lowercase a-z string, a bool")
    examples = [
        tasks.lexical_example(text, real, font, np.random.default_rng([seed, i]), jitter)
        for i, (text, real) in enumerate(pairs)
    ]
    if gate_mask_LF is None:
        gate_mask_LF = np.ones((cfg.decoder.num_layers, cfg.decoder.d_ff), np.float32)
    batches = lesion.batches(lesion.stack(examples), batch_size)
    answers = np.concatenate([np.asarray(_answers(cfg, params, b, gate_mask_LF)) for b in batches])
    items = [
        {"string": text, "real": bool(real), "answer": tasks.VOCAB[int(a)].strip("<>")}
        for (text, real), a in zip(pairs, answers[: len(pairs)], strict=True)
    ]
    right = [item["answer"] == ("yes" if item["real"] else "no") for item in items]
    return {"accuracy": float(np.mean(right)), "items": items}


def load_params(workdir: str):
    """(VLMConfig, params, its stimuli's jitter) of a launch.train run's newest good
    checkpoint."""
    from ml_collections import ConfigDict

    import methods
    from core import train
    from core.errors import ConfigError
    from methods.vwf_dyslexia import model_config

    try:
        with open(f"{workdir}/config.json") as f:
            config = ConfigDict(json.load(f))
    except FileNotFoundError:
        raise ConfigError(f"{workdir}: no config.json; pass a launch.train workdir") from None
    if config.get("method") != "vwf_dyslexia":
        raise ConfigError(f"{workdir} is a {config.get('method')!r} run, not vwf_dyslexia")
    config.train.init_from = workdir
    session = train.init(config, methods.make(config), devices=jax.devices()[:1])
    return model_config(config), session.state.params, config.data.get("jitter", 1.0)


def main(argv):
    del argv
    from absl import flags

    f = flags.FLAGS
    cfg, params, jitter = load_params(f.workdir)
    out = decide(cfg, params, read_pairs(f.words), font=f.font, seed=f.seed, jitter=jitter)
    for item in out["items"]:
        print(f"{item['string']:<12} {'real' if item['real'] else 'pseudo':<7} {item['answer']}")
    print(f"accuracy {out['accuracy']:.4f} on {len(out['items'])} items")
    if f.json:
        with open(f.json, "w") as file:
            json.dump(out, file, indent=1)


if __name__ == "__main__":
    from absl import app, flags

    flags.DEFINE_string("workdir", None, "A launch.train run of configs/vwf_dyslexia.py.")
    flags.DEFINE_string("words", None, "Items: '<string> <label>' per line.")
    flags.DEFINE_string("font", stimuli.FONTS[0], "A font file among matplotlib's.")
    flags.DEFINE_integer("seed", 0, "Fixes each item's size and place in the image.")
    flags.DEFINE_string("json", "", "Also write the answers and accuracy here.")
    flags.mark_flags_as_required(["workdir", "words"])
    app.run(main)
