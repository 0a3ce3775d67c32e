"""The attention core: what notebooks 01-04 and 11-12 build, in final form. It imports nothing above it.

- ``attention``: scores, the masked softmax, scaled dot-product attention (notebook 01);
- ``masks``: padding and causal masks, and the conversions between mask conventions (notebook 02);
- ``heads``: ``transpose_qkv`` / ``transpose_output``, the reshapes that split and join heads (notebook 03);
- ``mha``: ``MultiHeadAttention`` (notebook 04), with grouped K/V heads, rotary positions and a KV cache;
- ``rope``: rotary positions (notebook 12); ``kv_cache``: the cache for incremental decoding (notebook 11);
- ``variants``: the same module written three other ways (a loop over heads, einsum, sequence-first);
- ``_validate*``: the checks on arguments, kept out of the way of the formulas.
"""
