"""The tokenizer of a pretrained checkpoint: byte-level BPE from GGUF metadata or a HF folder.

    tok = Tokenizer.from_gguf(fields_from_reader(gguf.GGUFReader(path)), source=path)
    tok = Tokenizer.from_hf_folder(folder)        # tokenizer.json + tokenizer_config.json
    ids = tok.encode("<|im_start|>user\\nHi")      # special tokens in the text: one id each
    tok.decode(ids)                               # the text back (byte pieces joined first)
    prompt = tok.chat([{"role": "user", "content": "Hi"}])   # the checkpoint's own template
    stream = tok.stream(); text = "".join(stream.push(i) for i in ids) + stream.flush()

The BPE itself runs in the `tokenizers` package; this module only wires a GGUF file's fields
into it the way llama.cpp reads them (`tokenizer.ggml.pre` names the pre-tokenizer regexes) and
renders chat templates as Hugging Face does (sandboxed Jinja, trim_blocks and lstrip_blocks).
Bad metadata raises `TokenizerError`, one line naming the source and the field.
"""

import json
import numbers
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
import jinja2.sandbox
import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from core.errors import ConfigError

TEMPLATE_FIELD = "tokenizer.chat_template"
GGUF_CONTROL, GGUF_USER_DEFINED = 3, 4  # llama.cpp's token types: special / added tokens

# llama.cpp's `tokenizer.ggml.pre` names (src/llama-vocab.cpp) whose regexes we reproduce with
# `tokenizers` pre-tokenizers. "digits" families first split every number into single digits
# (llama.cpp's "\p{N}" expression), then apply GPT-2's regex; the others apply GPT-2's regex only.
# A file without the field is a plain GPT-2 tokenizer.
DIGIT_SPLIT_PRE = ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone")
GPT2_PRE = ("gpt-2", "gpt2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais")


class TokenizerError(ConfigError):
    """A tokenizer's metadata or chat template is unusable, described in one line."""


def fields_from_reader(reader) -> dict:
    """Every field of a `gguf.GGUFReader` as plain Python values (str, int, float, bool, lists)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def pre_tokenizer_for(pre: str | None, source: str):
    """The pre-tokenizer llama.cpp applies for `tokenizer.ggml.pre` == `pre`."""
    # use_regex=True is GPT-2's split; add_prefix_space=False: "Hello" at the start of a text is
    # the token "Hello", not " Hello" (the file's tokenizer.ggml.add_space_prefix is False).
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre is None or pre in GPT2_PRE:
        return byte_level
    if pre in DIGIT_SPLIT_PRE:
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, byte_level])
    supported = ", ".join(DIGIT_SPLIT_PRE + GPT2_PRE)
    raise TokenizerError(f"{source}: tokenizer.ggml.pre {pre!r} is not supported ({supported})")


def _field(fields: dict, name: str, source: str, kind, required: bool = True):
    value = fields.get(name)
    if value is None:
        if required:
            raise TokenizerError(f"{source}: the field {name} is missing")
        return None
    if not isinstance(value, kind):
        raise TokenizerError(f"{source}: {name} is a {type(value).__name__}, not {kind.__name__}")
    return value


def _merge_pairs(merges: list, vocab: dict, source: str) -> list[tuple[str, str]]:
    """GGUF's "left right" merge strings as pairs, each checked against the vocabulary.

    `tokenizers` panics (an opaque Rust backtrace) on a merge whose result is not a token.
    """
    pairs = []
    for rank, merge in enumerate(merges):
        parts = merge.split(" ") if isinstance(merge, str) else []
        if len(parts) != 2 or any(p not in vocab for p in parts) or "".join(parts) not in vocab:
            raise TokenizerError(
                f"{source}: tokenizer.ggml.merges[{rank}] {merge!r} is not two tokens whose "
                "concatenation is a token"
            )
        pairs.append((parts[0], parts[1]))
    return pairs


class Tokenizer:
    """Text <-> token ids and the chat template of one checkpoint (see the module docstring).

    `special` maps each special (control) token to its id; `bos_id`, `eos_id`, `pad_id` are None
    where the checkpoint names none. Generation stops at `eos_id`.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        special: dict[str, int],
        bos_id=None,
        eos_id=None,
        pad_id=None,
        chat_template: str | None = None,
        source: str = "",
    ):
        self.backend = backend
        self.special = dict(special)
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.chat_template = chat_template
        self.source = source
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self._template = None  # compiled on first use: plain-text use never needs it

    # ---- construction -----------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, fields: dict, source: str = "GGUF metadata") -> "Tokenizer":
        """From a GGUF file's fields (`fields_from_reader`); `source` names the file in errors."""
        source = str(source)
        model = _field(fields, "tokenizer.ggml.model", source, str)
        if model != "gpt2":
            raise TokenizerError(
                f"{source}: tokenizer.ggml.model {model!r} is not supported (only 'gpt2', "
                "byte-level BPE)"
            )
        pre = _field(fields, "tokenizer.ggml.pre", source, str, required=False)
        pre_tokenizer = pre_tokenizer_for(pre, source)
        tokens = _field(fields, "tokenizer.ggml.tokens", source, list)
        vocab = {token: i for i, token in enumerate(tokens)}
        if len(vocab) != len(tokens) or not all(isinstance(t, str) for t in tokens):
            raise TokenizerError(
                f"{source}: tokenizer.ggml.tokens has duplicate or non-text tokens"
            )
        merges = _merge_pairs(_field(fields, "tokenizer.ggml.merges", source, list), vocab, source)
        types = _field(fields, "tokenizer.ggml.token_type", source, list, required=False)
        if types is not None and len(types) != len(tokens):
            raise TokenizerError(
                f"{source}: tokenizer.ggml.token_type has {len(types)} entries for "
                f"{len(tokens)} tokens"
            )
        ids = {}
        for role in ("bos", "eos", "padding"):
            name = f"tokenizer.ggml.{role}_token_id"
            value = _field(fields, name, source, numbers.Integral, required=False)
            ids[role] = None if value is None else int(value)  # numpy ints from other readers
            if ids[role] is not None and not 0 <= ids[role] < len(tokens):
                raise TokenizerError(f"{source}: {name} {ids[role]} is outside the vocabulary")

        backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=merges))
        backend.pre_tokenizer = pre_tokenizer
        backend.decoder = decoders.ByteLevel()
        types = types or []
        control = [i for i, t in enumerate(types) if t == GGUF_CONTROL]
        added = [i for i, t in enumerate(types) if t == GGUF_USER_DEFINED]
        # Registered tokens are matched in the raw text before the BPE runs, so "<|im_start|>" is
        # one id (not five byte-level pieces) wherever it is written; they keep their file ids.
        backend.add_special_tokens(
            [AddedToken(tokens[i], special=True, normalized=False) for i in control]
        )
        backend.add_tokens([AddedToken(tokens[i], normalized=False) for i in added])
        template = _field(fields, TEMPLATE_FIELD, source, str, required=False)
        return cls(
            backend,
            special={tokens[i]: i for i in control},
            bos_id=ids["bos"],
            eos_id=ids["eos"],
            pad_id=ids["padding"],
            chat_template=template,
            source=source,
        )

    @classmethod
    def from_hf_folder(cls, folder) -> "Tokenizer":
        """From a Hugging Face folder: tokenizer.json, and tokenizer_config.json's chat template
        and bos/eos/pad tokens (or chat_template.jinja, where the template is stored apart)."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as err:  # the Rust side raises a bare Exception
            detail = str(err).splitlines()[0] if str(err) else type(err).__name__
            raise TokenizerError(f"{path}: not a readable tokenizer.json ({detail})") from None
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = {t.get("name"): t.get("template") for t in template}.get("default")
        if template is None and (folder / "chat_template.jinja").exists():
            template = (folder / "chat_template.jinja").read_text()

        def token_id(role: str):
            token = config.get(f"{role}_token")
            token = token.get("content") if isinstance(token, dict) else token
            return None if token is None else backend.token_to_id(token)

        special = {
            added.content: i
            for i, added in backend.get_added_tokens_decoder().items()
            if added.special
        }
        return cls(
            backend,
            special=special,
            bos_id=token_id("bos"),
            eos_id=token_id("eos"),
            pad_id=token_id("pad"),
            chat_template=template,
            source=str(folder),
        )

    # ---- text <-> ids -----------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in it map to one id each. No BOS/EOS is
        added (chat templates write their own)."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special: bool = False) -> str:
        """The text of `ids`: byte-level pieces are joined into bytes before UTF-8 decoding, so a
        character split over several tokens comes back whole."""
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def token(self, token_id: int) -> str | None:
        """The vocabulary entry of one id (byte-level form, e.g. "ĠParis"), None if unknown."""
        return self.backend.id_to_token(int(token_id))

    def stream(self, skip_special: bool = False) -> "StreamDecoder":
        """An incremental decoder for generated ids: `.push(id)` returns the new printable text."""
        return StreamDecoder(self, skip_special)

    # ---- chat template ----------------------------------------------------------------------

    def chat(self, messages, add_generation_prompt: bool = True, **variables) -> str:
        """`messages` ([{"role", "content"}, ...]) rendered with the checkpoint's chat template.

        The template is the model's own: SmolLM2's inserts its default system turn when the first
        message is not a system message. Extra `variables` (e.g. tools) reach the template.
        """
        template = self._compiled_template()
        context = {
            "messages": list(messages),
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.token(self.bos_id) if self.bos_id is not None else "",
            "eos_token": self.token(self.eos_id) if self.eos_id is not None else "",
            **variables,
        }
        try:
            return template.render(**context)
        except jinja2.TemplateError as err:
            raise TokenizerError(
                f"{self.source}: {TEMPLATE_FIELD} failed: {_one_line(err)}"
            ) from None

    def encode_chat(self, messages, add_generation_prompt: bool = True, **variables) -> list[int]:
        """Token ids of `chat(messages, ...)`: the prompt a chat model continues."""
        return self.encode(self.chat(messages, add_generation_prompt, **variables))

    def _compiled_template(self) -> jinja2.Template:
        if self._template is None:
            if not self.chat_template:
                raise TokenizerError(f"{self.source}: no {TEMPLATE_FIELD} (not a chat model)")
            try:
                self._template = _template_environment().from_string(self.chat_template)
            except jinja2.TemplateError as err:
                raise TokenizerError(
                    f"{self.source}: {TEMPLATE_FIELD} does not compile: {_one_line(err)}"
                ) from None
        return self._template


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split()) or type(err).__name__


def _raise_exception(message):
    raise jinja2.TemplateError(message)


def _tojson(value, indent=None):
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _template_environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
    """Jinja as transformers renders chat templates: sandboxed, trim_blocks and lstrip_blocks,
    loop controls, `raise_exception`, `tojson` (non-ASCII kept) and `strftime_now`."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


class StreamDecoder:
    """Text of generated ids as they arrive, never a half character.

    Decodes a short window of recent ids and emits what it adds to the window's already printed
    prefix, holding back text that ends in U+FFFD: the bytes of a character split over tokens
    (e.g. an emoji's four bytes over two tokens) are printed once the last one arrives. The
    window keeps one printed chunk for context, as decoders such as SentencePiece's drop a
    leading space at the start of a decode.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self.tokenizer, self.skip_special = tokenizer, skip_special
        self.ids: list[int] = []
        self.prefix = self.read = 0  # window start; end of the ids already printed

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special=self.skip_special)

    def push(self, token_id: int) -> str:
        """Append one id; return the newly printable text ("" while a character is incomplete)."""
        self.ids.append(int(token_id))
        printed = self._decode(self.ids[self.prefix : self.read])
        text = self._decode(self.ids[self.prefix :])
        if len(text) <= len(printed) or text.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(printed) :]

    def flush(self) -> str:
        """What is still held back at the end (invalid UTF-8 comes out as U+FFFD)."""
        printed = self._decode(self.ids[self.prefix : self.read])
        text = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return text[len(printed) :]
