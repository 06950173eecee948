"""Layers shared by several methods. Import the submodules directly (no re-exports, so that
`import core.nn.positions` does not pay for flax):

  positions    position encodings for attention: "none", "rope"; `apply_positions(kind, ...)`
  transformer  decoder-only LM: TransformerConfig, init_params, apply, init_cache, SHARDING_RULES
  sampler      KV-cached sampling: filter_logits, sample, sample_jit, SampleOutput
"""
