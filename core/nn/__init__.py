"""Layers and models shared by several methods. Import the submodules directly (no re-exports,
so that `import core.nn.positions` does not pay for flax):

  pure         PureModule(constructor): the one adapter between NNX modules and the core
               (init -> plain params, bind -> the module, graphdef cached per hashable cfg);
               every model here uses it, and a new NNX model should too
  layers       RMSNorm, dense_factory, SwiGLU (with_gate: the gate pre-activation, a unit
               mask), PreNormBlock (NNX modules any model config uses)
  positions    position encodings for attention: "none", "rope", "rope2d" (a 2-D grid);
               `apply_positions(kind, ...)`
  attention    make_mask (causal / bidirectional / block / segment + key padding),
               encode_positions (a kind or a method's function), attend (impl xla /
               dot_product / auto), MultiHeadAttention, write_cache
  transformer  the LM: TransformerConfig, init_params, apply (tokens or embeddings), forward
               (captured intermediates), embed, features, head, next_token_loss, init_cache, policy,
               SHARDING_RULES
  image        patchify / unpatchify, 2-D sin-cos and grid positions, image-stack checks
  dit          DiT / DDT (condition encoder + velocity decoder) for images: DiTConfig,
               init_params, apply / encode / decode (captured intermediates), sampler_fns,
               patchify, null_label (the samplers are core.diffusion's)
  vit          ViT encoder for images [B, H, W, C] (any aspect ratio): ViTConfig, init_params,
               apply -> tokens [B, N, D], forward (captured intermediates)
  vlm          vision-language model: ViT -> linear merger -> the transformer decoder (image
               tokens first, causal); apply / step (KV cache) with captures (every decoder
               MLP's gate pre-activation: gate_names) and a unit lesion gate_mask_LF
  policy       Policy: a model as pure functions (apply, init_cache, embed) for sampler / GRPO
  sampler      KV-cached sampling of any Policy: filter_logits, sample, sample_jit, SampleOutput;
               a next-input rule hook (NextInputRule, StepContext, NextInput, token_rule)
"""
