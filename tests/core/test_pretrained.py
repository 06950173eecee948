"""core.pretrained on a tiny random Llama written by the test twice: as a Hugging Face folder
(half-split q/k) and as a GGUF file (q/k permuted as llama.cpp's converter does, one tensor
Q8_0-quantized). Both routes give identical params and logits, which equal a float64 NumPy
forward; a sharded load gives the single-device logits; the dequantized cache is read on the
second load and never serves a changed file; bad input is one line naming the file and tensor.
The NumPy reference (`reference_logits`) also serves the real-file tests."""

import json

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QType
from safetensors.numpy import save_file

from configs.common import mesh_config
from core import pretrained
from core.mesh import make_mesh
from core.nn import transformer
from core.pretrained import gguf_file

V, L, D, H, G, F, CTX = 300, 2, 64, 4, 2, 96, 128
K = D // H
ROPE_BASE, EPS = 10000.0, 1e-5
QUANTIZED = "model.layers.1.mlp.up_proj.weight"  # stored as Q8_0 in the GGUF file
TOKENS = np.array([[5, 17, 42, 299, 0, 3, 250, 77, 1, 9, 18]])


# ------------------------------------------------------------------------------------------
# The NumPy reference: a Llama forward in float64 over Hugging Face-named [out, in] weights


def _rms(x, scale, eps):
    return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * scale


def _rope(x_THK, base, layout):
    """Rotary embedding of positions 0..T-1; "half" pairs j with j + K/2 (HF), "interleaved"
    pairs (2j, 2j+1) (llama.cpp's rotation of its stored weights)."""
    T, _, k = x_THK.shape
    angle_TJ = np.arange(T)[:, None] * base ** (-np.arange(0, k, 2) / k)[None, :]
    cos, sin = np.cos(angle_TJ)[:, None], np.sin(angle_TJ)[:, None]
    if layout == "half":
        a, b = x_THK[..., : k // 2], x_THK[..., k // 2 :]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)
    a, b = x_THK[..., 0::2], x_THK[..., 1::2]
    out = np.empty_like(x_THK)
    out[..., 0::2], out[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    return out


def reference_logits(w, tokens_T, *, layers, heads, kv_heads, base, eps, layout="half", names=None):
    """Float64 logits [T, V]. `w` maps names to arrays; `names(kind, i)` gives a tensor's name
    (default: Hugging Face's). The head is lm_head.weight, else the embedding (tied)."""
    names = names or _hf_name
    get = lambda kind, i=None: np.asarray(w[names(kind, i)], np.float64)  # noqa: E731
    x = get("embed")[tokens_T]
    T = len(tokens_T)
    causal_TS = np.tril(np.ones((T, T), bool))
    for i in range(layers):
        h = _rms(x, get("attn_norm", i), eps)
        q = _rope((h @ get("q", i).T).reshape(T, heads, -1), base, layout)
        k = _rope((h @ get("k", i).T).reshape(T, kv_heads, -1), base, layout)
        v = (h @ get("v", i).T).reshape(T, kv_heads, -1)
        group = heads // kv_heads  # query head j reads kv head j // group
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        s_HTS = np.einsum("thk,shk->hts", q, k) / np.sqrt(q.shape[-1])
        s_HTS = np.where(causal_TS, s_HTS, -np.inf)
        p_HTS = np.exp(s_HTS - s_HTS.max(-1, keepdims=True))
        p_HTS /= p_HTS.sum(-1, keepdims=True)
        x = x + np.einsum("hts,shk->thk", p_HTS, v).reshape(T, -1) @ get("o", i).T
        h = _rms(x, get("mlp_norm", i), eps)
        gate = h @ get("gate", i).T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ get("up", i).T)) @ get("down", i).T
    h = _rms(x, get("final_norm"), eps)
    head = get("lm_head") if names("lm_head", None) in w else get("embed")
    return h @ head.T


HF_NAMES = {
    "q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
    "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
    "down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "mlp_norm": "post_attention_layernorm",
}  # fmt: skip
GGUF_NAMES = {
    "q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
    "up": "ffn_up", "down": "ffn_down", "attn_norm": "attn_norm", "mlp_norm": "ffn_norm",
}  # fmt: skip


def _hf_name(kind, i):
    top = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight"}
    top["lm_head"] = "lm_head.weight"
    return top[kind] if i is None else f"model.layers.{i}.{HF_NAMES[kind]}.weight"


def gguf_name(kind, i):
    top = {"embed": "token_embd.weight", "final_norm": "output_norm.weight"}
    top["lm_head"] = "output.weight"
    return top[kind] if i is None else f"blk.{i}.{GGUF_NAMES[kind]}.weight"


# ------------------------------------------------------------------------------------------
# The tiny checkpoint, written both ways


def hf_weights(seed=0, tied=False) -> dict[str, np.ndarray]:
    """Random HF-layout weights; the QUANTIZED tensor already holds its Q8_0 round trip, so
    the HF folder and the GGUF file carry the same numbers."""
    rng = np.random.default_rng(seed)
    shapes = {"q": (H * K, D), "k": (G * K, D), "v": (G * K, D), "o": (D, H * K)}
    shapes |= {"gate": (F, D), "up": (F, D), "down": (D, F), "attn_norm": (D,), "mlp_norm": (D,)}
    w = {}
    for i in range(L):
        for kind, shape in shapes.items():
            base = 1.0 if kind.endswith("norm") else 0.0  # norm scales near 1
            w[_hf_name(kind, i)] = (base + 0.2 * rng.standard_normal(shape)).astype(np.float32)
    w["model.embed_tokens.weight"] = rng.standard_normal((V, D)).astype(np.float32)
    w["model.norm.weight"] = (1 + 0.2 * rng.standard_normal(D)).astype(np.float32)
    if not tied:
        w["lm_head.weight"] = (0.2 * rng.standard_normal((V, D))).astype(np.float32)
    w[QUANTIZED] = gguf.quants.dequantize(
        gguf.quants.quantize(w[QUANTIZED], QType.Q8_0), QType.Q8_0
    )
    return w


def write_hf(folder, w, *, tied=False, **config):
    folder.mkdir(parents=True, exist_ok=True)
    c = {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": V,
        "hidden_size": D, "num_hidden_layers": L, "num_attention_heads": H,
        "num_key_value_heads": G, "intermediate_size": F, "max_position_embeddings": CTX,
        "rope_theta": ROPE_BASE, "rms_norm_eps": EPS, "tie_word_embeddings": tied,
        "hidden_act": "silu",
    } | config  # fmt: skip
    (folder / "config.json").write_text(json.dumps(c))
    save_file(w, folder / "model.safetensors")
    return folder


def permute(w_OI, heads):
    """llama.cpp's convert_hf_to_gguf: q/k rows reordered for its interleaved rotation."""
    out, d_in = w_OI.shape
    return w_OI.reshape(heads, 2, out // heads // 2, d_in).swapaxes(1, 2).reshape(out, d_in)


def _quantized(x, qtype):
    """`x` in `qtype`'s blocks; zero bytes of the right size for a type gguf cannot encode
    (enough for a file whose loading must stop at the type)."""
    try:
        return gguf.quants.quantize(x, qtype)
    except NotImplementedError:
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        return np.zeros((x.shape[0], x.shape[1] // block * size), np.uint8)


def write_gguf(path, w, *, arch="llama", quantize=(QUANTIZED,), qtype=QType.Q8_0):
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(L)
    writer.add_context_length(CTX)
    writer.add_embedding_length(D)
    writer.add_feed_forward_length(F)
    writer.add_head_count(H)
    writer.add_head_count_kv(G)
    writer.add_rope_freq_base(ROPE_BASE)
    writer.add_layer_norm_rms_eps(EPS)
    writer.add_rope_dimension_count(K)
    hf_of = {gguf_name(kind, i): _hf_name(kind, i) for kind in HF_NAMES for i in range(L)}
    hf_of |= {gguf_name(k, None): _hf_name(k, None) for k in ("embed", "final_norm", "lm_head")}
    for name, hf in hf_of.items():
        if hf not in w:
            continue
        x = w[hf]
        if ".attn_q." in name or ".attn_k." in name:
            x = permute(x, H if ".attn_q." in name else G)
        if hf in quantize:
            writer.add_tensor(name, _quantized(x, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(name, np.ascontiguousarray(x, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ICLR26_PRETRAINED_DIR", str(tmp_path / "cache"))


@pytest.fixture(params=[False, True], ids=["untied", "tied"])
def tiny(request, tmp_path):
    tied = request.param
    w = hf_weights(tied=tied)
    hf = write_hf(tmp_path / "hf", w, tied=tied)
    return w, hf, write_gguf(tmp_path / "tiny.gguf", w), tied


def logits_of(model, tokens=TOKENS):
    return np.asarray(transformer.apply(model.cfg, model.params, jnp.asarray(tokens))[0])


def reference(w, tokens=TOKENS[0]):
    return reference_logits(w, tokens, layers=L, heads=H, kv_heads=G, base=ROPE_BASE, eps=EPS)


# ------------------------------------------------------------------------------------------


def test_hf_and_gguf_routes_give_identical_params_and_the_reference_logits(tiny):
    w, hf_dir, gguf_path, tied = tiny
    from_hf, from_gguf = pretrained.load(hf_dir), pretrained.load(gguf_path)
    assert from_hf.cfg == from_gguf.cfg
    assert (from_hf.cfg.num_kv_heads, from_hf.cfg.tie_embeddings) == (G, tied)
    assert from_hf.cfg.norm_eps == EPS and from_hf.cfg.rope_layout == "half"
    # The structure of a fresh transformer of this config, leaf for leaf.
    fresh = transformer.init_params(from_hf.cfg, jax.random.PRNGKey(0))
    assert jax.tree.structure(from_hf.params) == jax.tree.structure(fresh)
    jax.tree.map(np.testing.assert_array_equal, from_hf.params, from_gguf.params)
    # Flax kernels are HF's [out, in] transposed; the quantized tensor is its dequantized value.
    up = from_gguf.params["blocks"][1]["mlp"]["up"]["kernel"]
    np.testing.assert_array_equal(up, w[QUANTIZED].T)
    q = from_gguf.params["blocks"][0]["attn"]["q"]["kernel"]
    np.testing.assert_array_equal(q, w["model.layers.0.self_attn.q_proj.weight"].T)
    logits = logits_of(from_gguf)
    np.testing.assert_array_equal(logits, logits_of(from_hf))
    # float32 forward vs float64 NumPy over 2 layers: rounding ~1e-6 relative to logits of
    # size ~10; 1e-4 absolute leaves headroom yet a wrong rotation or head mapping is O(1).
    np.testing.assert_allclose(logits[0], reference(w), atol=1e-4, rtol=1e-4)


def test_the_gguf_reference_with_interleaved_rope_equals_the_hf_one(tiny):
    """The GGUF file's own numbers (q/k permuted), rotated as llama.cpp rotates them, give the
    HF logits: the permutation the test writes is the one llama.cpp undoes by rotating pairs
    (so the loader's un-permutation is checked against llama.cpp's convention, not our own)."""
    w, _, gguf_path, _ = tiny
    reader = gguf.GGUFReader(gguf_path)
    raw = {t.name: gguf_file.dequantize(t, gguf_path) for t in reader.tensors}
    got = reference_logits(
        raw, TOKENS[0], layers=L, heads=H, kv_heads=G, base=ROPE_BASE, eps=EPS,
        layout="interleaved", names=gguf_name,
    )  # fmt: skip
    np.testing.assert_allclose(got, reference(w), atol=1e-9)  # float64 both: same sums reordered


def test_config_reads_metadata_only_and_matches_the_load(tiny, monkeypatch):
    _, hf_dir, gguf_path, _ = tiny

    def no_dequantizing(*args):
        raise AssertionError("config() dequantized a tensor")

    monkeypatch.setattr(gguf_file.quants, "dequantize", no_dequantizing)
    cfg = pretrained.config(gguf_path, max_len=64, dtype="bfloat16")
    assert (cfg.max_len, cfg.dtype, cfg.param_dtype) == (64, "bfloat16", "bfloat16")
    assert pretrained.config(hf_dir) == pretrained.config(gguf_path)
    assert pretrained.config(hf_dir).max_len == CTX


def test_a_sharded_load_gives_the_single_device_logits(tmp_path):
    w = hf_weights()
    path = write_gguf(tmp_path / "tiny.gguf", w)
    single = pretrained.load(path)
    c = mesh_config("auto")
    c.shape = (2, 1, 4)  # data 2, model 4
    mesh = make_mesh(c)
    sharded = pretrained.load(path, mesh=mesh)
    q = sharded.params["blocks"][0]["attn"]["q"]["kernel"]
    assert isinstance(q, jax.Array) and q.sharding.spec == jax.P(None, "model")
    assert sharded.params["embed"]["embedding"].sharding.spec == jax.P("model", None)
    tokens = np.concatenate([TOKENS, TOKENS[:, ::-1]])  # batch 2: one row per data shard
    batch = jax.device_put(tokens, jax.NamedSharding(mesh, jax.P("data")))
    got = jax.jit(lambda p, t: transformer.apply(sharded.cfg, p, t)[0])(sharded.params, batch)
    # Sharded matmuls sum in another order: float32 rounding only.
    np.testing.assert_allclose(np.asarray(got), logits_of(single, tokens), atol=1e-5, rtol=1e-5)


def test_bfloat16_load_casts_params_and_config(tmp_path):
    w = hf_weights()
    model = pretrained.load(write_gguf(tmp_path / "tiny.gguf", w), dtype="bfloat16")
    assert model.cfg.param_dtype == "bfloat16"
    assert {x.dtype for x in jax.tree.leaves(model.params)} == {np.dtype(jnp.bfloat16)}
    np.testing.assert_array_equal(
        model.params["final_norm"]["scale"], w["model.norm.weight"].astype(jnp.bfloat16)
    )


def test_a_sharded_bfloat16_hf_folder_gives_the_weights_it_holds(tmp_path):
    """model.safetensors.index.json over two shards, stored in bfloat16 (as HF ships Llamas):
    the float32 params of the same bfloat16 numbers."""
    w16 = {name: x.astype(jnp.bfloat16) for name, x in hf_weights().items()}
    folder = tmp_path / "sharded"
    write_hf(folder, {})
    (folder / "model.safetensors").unlink()
    names = sorted(w16)
    shards = {"model-00001-of-00002.safetensors": names[::2]}
    shards["model-00002-of-00002.safetensors"] = names[1::2]
    for file, shard_names in shards.items():
        save_file({n: w16[n] for n in shard_names}, folder / file)
    weight_map = {n: file for file, shard_names in shards.items() for n in shard_names}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    got = pretrained.load(folder)
    want = pretrained.load(
        write_hf(tmp_path / "single", {n: x.astype(np.float32) for n, x in w16.items()})
    )
    jax.tree.map(np.testing.assert_array_equal, got.params, want.params)


def test_the_second_load_reads_the_cache_and_a_changed_file_is_not_served_from_it(
    tmp_path, monkeypatch
):
    path = write_gguf(tmp_path / "tiny.gguf", hf_weights(seed=0))
    other = hf_weights(seed=1)  # made before the dequantizer is patched (it uses it)
    first = pretrained.load(path)
    cached = list((pretrained.cache_dir() / "dequantized").glob("*.safetensors"))
    assert [p.stem for p in cached] == [gguf_file.sha256(path)]

    def dequantize_again(*args):
        raise RuntimeError("dequantized again")

    def parse_again(*args):
        raise RuntimeError("parsed again")

    with monkeypatch.context() as patch:
        patch.setattr(gguf_file.quants, "dequantize", dequantize_again)
        patch.setattr(gguf_file, "GGUFReader", parse_again)  # metadata: the cache's header
        second = pretrained.load(path)
        assert pretrained.config(path) == first.cfg
        jax.tree.map(np.testing.assert_array_equal, first.params, second.params)
        patch.undo()
        patch.setattr(gguf_file.quants, "dequantize", dequantize_again)
        write_gguf(path, other)  # same path and size, other numbers: another hash
        with pytest.raises(RuntimeError, match="dequantized again"):
            pretrained.load(path)
    changed = pretrained.load(path)
    np.testing.assert_array_equal(changed.params["final_norm"]["scale"], other["model.norm.weight"])


# ------------------------------------------------------------------------------------------
# Bad input: one line naming the file and the tensor or field


def refused(match, fn, *args, **kwargs):
    with pytest.raises(pretrained.PretrainedError, match=match) as e:
        fn(*args, **kwargs)
    assert "\n" not in str(e.value), str(e.value)
    return str(e.value)


def test_missing_files_and_unknown_names_are_one_line(tmp_path):
    refused(r"nope\.gguf: no such file", pretrained.load, tmp_path / "nope.gguf")
    message = refused("unknown pretrained model 'smollm3'", pretrained.load, "smollm3")
    assert "smollm2-135m-instruct" in message  # the known names are listed
    (tmp_path / "empty").mkdir()
    refused(r"empty/config\.json: no such file", pretrained.config, tmp_path / "empty")


def test_truncated_gguf_and_safetensors_files_are_refused(tmp_path):
    w = hf_weights()
    for path in (write_gguf(tmp_path / "cut.gguf", w), write_hf(tmp_path / "hf", w)):
        target = path if path.is_file() else path / "model.safetensors"
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
        for fn in (pretrained.config, pretrained.load):
            refused(rf"{target.name}: truncated or corrupt", fn, path)


def test_an_unsupported_quantization_type_is_refused_by_name(tmp_path):
    w = hf_weights()
    path = write_gguf(tmp_path / "q.gguf", w, quantize=(_hf_name("down", 0),), qtype=QType.Q8_1)
    message = refused("'blk.0.ffn_down.weight' has quantization type Q8_1", pretrained.load, path)
    assert "q.gguf" in message and "Q8_0" in message  # names the file and the supported types


def test_shapes_that_do_not_match_the_config_and_missing_tensors_are_refused(tmp_path):
    w = hf_weights()
    bad = dict(w)
    bad["model.layers.1.self_attn.q_proj.weight"] = w["model.layers.1.self_attn.q_proj.weight"][:-K]
    refused(
        r"hf: tensor 'model.layers.1.self_attn.q_proj.weight' has shape \(48, 64\), expected "
        r"\(64, 64\)",
        pretrained.load,
        write_hf(tmp_path / "hf", bad),
    )
    refused(
        r"q\.gguf: tensor 'blk.1.attn_q.weight' has shape \(48, 64\)",
        pretrained.config,
        write_gguf(tmp_path / "q.gguf", bad),
    )
    del bad["model.layers.1.self_attn.q_proj.weight"], bad["model.layers.0.mlp.up_proj.weight"]
    refused("'model.layers.0.mlp.up_proj.weight' is missing", pretrained.load, write_hf(
        tmp_path / "hf2", bad))  # fmt: skip
    refused("'blk.0.ffn_up.weight' is missing", pretrained.load, write_gguf(
        tmp_path / "m.gguf", bad))  # fmt: skip
    tied_but_different = write_hf(tmp_path / "tied", w, tied=True)
    refused("'lm_head.weight' differs", pretrained.load, tied_but_different)


def test_other_architectures_are_refused(tmp_path):
    w = hf_weights()
    refused(
        r"g\.gguf: general\.architecture='gpt2'",
        pretrained.load,
        write_gguf(tmp_path / "g.gguf", w, arch="gpt2"),
    )
    refused(
        "model_type='mistral'", pretrained.load, write_hf(tmp_path / "m", w, model_type="mistral")
    )
    refused(
        "rope_scaling=", pretrained.load, write_hf(tmp_path / "r", w, rope_scaling={"type": "yarn"})
    )
