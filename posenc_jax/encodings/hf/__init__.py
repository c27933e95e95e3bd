"""Hugging Face transformers configs: per-layer, multimodal and MLA RoPE read as transformers
5.x reads them (`read`), the model-class knowledge a config.json does not carry
(`families`), parity rotation (`rotate.rotate_like_hf`) and TransformerConfig kwargs
(`layers`). `posenc_jax.hf_config` is the public entry point."""
