"""Generate text with a pretrained LM from the command line, token by token as it is decoded.

    python -m launch.generate --model=smollm2-135m-instruct \
        --prompt="What is the capital of France? Answer in one sentence."
    python -m launch.generate --model=/data/model.gguf --chat=false --prompt="Once upon a time"
    python -m launch.generate --model=smollm2-135m-instruct --prompt="..." --temperature=0.7 \
        --top_p=0.9 --seed=1 --dtype=bfloat16

--model: a name of `core.pretrained.MODELS` (fetched once into the cache) or a path (a .gguf
file or a Hugging Face folder). --chat (default) wraps the prompt in the model's chat template
(--system: a system message; without one the template's own default applies); --chat=false
continues the raw text. The answer streams to stdout and ends at the tokenizer's eos (not
printed) or after --max_new_tokens tokens; then two lines go to stderr, the prefill's and the
decode's token counts and tokens/s (compilation timed apart). Bad input: one line, exit 2.
"""

import sys

from absl import app, flags, logging

from core.errors import ConfigError

_MODEL = flags.DEFINE_string("model", None, "A registered model name or a .gguf / HF path.")
_PROMPT = flags.DEFINE_string("prompt", None, "The user message (or raw text with --chat=false).")
_SYSTEM = flags.DEFINE_string("system", None, "A system message (chat only).")
_CHAT = flags.DEFINE_bool("chat", True, "Wrap the prompt in the model's chat template.")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 256, "Stop after this many new tokens.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 = greedy; else sample at it.")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass (1 = off).")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Keep the k most likely tokens (0 = off).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_DTYPE = flags.DEFINE_enum(
    "dtype",
    "float32",
    ["float32", "bfloat16"],
    "Params and compute. On CPU bfloat16 decodes ~15x slower (XLA:CPU widens the bfloat16 "
    "weights to float32 on every call; methods/lm/bench.py measures it).",
)


def check_prompt(prompt: str | None) -> None:
    if prompt is None or not prompt.strip():
        raise ConfigError("launch.generate: --prompt is empty; give the text to answer")


def prompt_ids(tokenizer, prompt: str, *, chat: bool, system: str | None) -> list[int]:
    """The prompt's token ids: the chat template around it, or the raw text."""
    check_prompt(prompt)
    if not chat:
        if system is not None:
            raise ConfigError("launch.generate: --system needs --chat (the chat template)")
        return tokenizer.encode(prompt)
    messages = [{"role": "system", "content": system}] if system is not None else []
    return tokenizer.encode_chat([*messages, {"role": "user", "content": prompt}])


def run(out=sys.stdout, err=sys.stderr):
    """Loads the model, streams the answer to `out` and the speed lines to `err`; returns the
    stream's `core.pretrained.generate.Stats`."""
    from core import compile_cache

    compile_cache.enable()  # a second run loads its two programs instead of compiling them
    import jax

    from core import pretrained
    from core.pretrained import generate

    if not _MODEL.value:
        raise ConfigError("launch.generate: --model is required (a registered name or a path)")
    check_prompt(_PROMPT.value)  # before loading: an empty prompt costs no model load
    model = pretrained.load(_MODEL.value, dtype=_DTYPE.value)
    if model.tokenizer is None:
        raise ConfigError(f"launch.generate: --model={_MODEL.value} has no tokenizer")
    ids = prompt_ids(model.tokenizer, _PROMPT.value, chat=_CHAT.value, system=_SYSTEM.value)
    tokens = generate.stream(
        model.cfg,
        generate.as_device_params(model.params),
        ids,
        max_new_tokens=_MAX_NEW.value,
        temperature=_TEMPERATURE.value,
        top_k=_TOP_K.value,
        top_p=_TOP_P.value,
        rng=jax.random.PRNGKey(_SEED.value),
        eos_id=model.tokenizer.eos_id,
    )
    text = model.tokenizer.stream(skip_special=False)
    for token in tokens:
        if token == model.tokenizer.eos_id:
            break
        out.write(text.push(token))
        out.flush()
    out.write(text.flush() + "\n")
    out.flush()  # the answer before the speed lines, also when both go to one pipe
    s = tokens.stats
    print(
        f"prefill: {s.prompt_tokens} tokens in {s.prefill_s:.3f} s, "
        f"{s.prefill_tokens_per_s:.1f} tokens/s (compile {s.compile_s:.1f} s, not counted)",
        file=err,
    )
    print(
        f"decode: {s.decode_steps} tokens in {s.decode_s:.3f} s, "
        f"{s.decode_tokens_per_s:.1f} tokens/s ({s.new_tokens} new tokens, {model.cfg.dtype})",
        file=err,
    )
    return s


def main(argv):
    if len(argv) > 1:
        sys.exit(f"error: unexpected arguments {' '.join(argv[1:])!r}; pass --prompt=...")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)
    try:
        run()
    except ConfigError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    from launch.config_cli import parse_flags

    app.run(main, flags_parser=parse_flags)
