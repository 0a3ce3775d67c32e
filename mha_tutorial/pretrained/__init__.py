"""Real pretrained models opened with the series' own code (notebooks 09 and 14).

- ``bert``: a BERT-style encoder built from ``core.MultiHeadAttention``; ``minilm``: loading all-MiniLM-L6-v2's
  weights (sha256 checked) and its tokenizer; ``bert_heads``: what its heads attend to;
- ``retrieval``, ``retrieval_study``: sentence retrieval and which heads it needs;
- ``llama``: a Llama-style decoder (RMSNorm, SwiGLU, grouped-query rotary ``MultiHeadAttention``, KV cache, greedy
  decoding); ``smollm``: SmolLM2-135M's 4-bit GGUF file (sha256 checked) and its tokenizer loaded into it;
  ``llama_hf``: its weights copied into transformers' ``LlamaForCausalLM``; ``smollm_study``: its heads and K/V
  groups measured by perplexity (notebook 14).
"""
