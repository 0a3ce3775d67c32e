"""Attention as today's language models use it, beyond the core module (notebooks 10-13).

- ``flash``: tiled attention with the online softmax, forward and backward (notebook 10); ``flash_triton``: the same
  algorithm as GPU kernels;
- ``gqa``: converting multi-head attention to grouped-query attention by pooling K/V heads (notebook 13), and
  removing whole K/V groups (notebook 14);
- ``length_study``, ``gqa_study``: the two experiments notebooks 12 and 13 read (learned, sinusoidal and rotary
  positions on longer inputs; converted checkpoints against KV-cache bytes).

The rotation itself and the KV cache live in ``core``: ``MultiHeadAttention`` applies them.
"""
