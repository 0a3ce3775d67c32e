"""Our ``LlamaDecoder``'s weights, copied into transformers' ``LlamaForCausalLM`` (notebook 14's race, issue 23).

The two models have the same parts under other names; this module is the dictionary between them, so that the
same numbers can run through both implementations, side by side:

==============================  ===========================================
ours (``LlamaDecoder``)         transformers (``LlamaForCausalLM``)
==============================  ===========================================
``embedding``                   ``model.embed_tokens``
``layers.i.norm1``              ``model.layers.i.input_layernorm``
``layers.i.self_attn.W_q``      ``model.layers.i.self_attn.q_proj`` (k, v, o alike)
``layers.i.norm2``              ``model.layers.i.post_attention_layernorm``
``layers.i.mlp.gate`` / up/down ``model.layers.i.mlp.gate_proj`` / up_proj / down_proj
``norm``                        ``model.norm``
``head`` (tied to embedding)    ``lm_head`` (tied to embed_tokens)
==============================  ===========================================

Both rotate q and k in the "half" layout (transformers' ``rotate_half``), so W_q and W_k are copied as they are.
That the loader of ``smollm`` reads the GGUF file as transformers' own GGUF loader does is proven separately, in
tests/pretrained/test_smollm.py; here only the copy is made.
"""

from __future__ import annotations

import os

import torch

from .llama import LlamaDecoder

__all__ = ["to_transformers", "transformers_config", "transformers_names"]

_LAYER_NAMES = {
    "norm1.weight": "input_layernorm.weight",
    "self_attn.W_q.weight": "self_attn.q_proj.weight",
    "self_attn.W_k.weight": "self_attn.k_proj.weight",
    "self_attn.W_v.weight": "self_attn.v_proj.weight",
    "self_attn.W_o.weight": "self_attn.o_proj.weight",
    "norm2.weight": "post_attention_layernorm.weight",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}


def transformers_names(num_layers: int) -> dict[str, str]:
    """Our state_dict's names -> transformers' (the head is tied, so it is not listed)."""
    names = {"embedding.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    for i in range(num_layers):
        names.update({f"layers.{i}.{ours}": f"model.layers.{i}.{theirs}" for ours, theirs in _LAYER_NAMES.items()})
    return names


def transformers_config(model: LlamaDecoder):
    """transformers' ``LlamaConfig`` with our model's sizes (float32, SDPA attention, nothing downloaded)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing below needs the network; make sure nothing tries
    from transformers import LlamaConfig as HFLlamaConfig

    c = model.config
    return HFLlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.num_hiddens,
        intermediate_size=c.ffn_num_hiddens,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_size,
        max_position_embeddings=c.max_len,
        rms_norm_eps=c.eps,
        rope_theta=c.rope_base,
        tie_word_embeddings=c.tie_embeddings,
        attention_bias=False,
        mlp_bias=False,
        hidden_act="silu",
        torch_dtype="float32",
        attn_implementation="sdpa",
    )


@torch.no_grad()
def to_transformers(model: LlamaDecoder):
    """A ``transformers.LlamaForCausalLM`` holding copies of ``model``'s weights, in eval mode, on its device."""
    if not isinstance(model, LlamaDecoder):
        raise TypeError(f"model must be a LlamaDecoder, got {type(model).__name__}")
    if not model.config.tie_embeddings:
        raise ValueError("to_transformers copies tied models only (the output head shares the embedding)")
    if any(block.self_attn.num_heads != model.config.num_heads for block in model.layers):
        raise ValueError("to_transformers copies unpruned models only (transformers' config has one head count)")
    from transformers import LlamaForCausalLM
    from transformers.initialization import no_init_weights

    config = transformers_config(model)
    with no_init_weights():  # every weight is copied below
        theirs = LlamaForCausalLM(config)
    names = transformers_names(model.config.num_layers)
    state = {names[name]: tensor.detach().clone() for name, tensor in model.state_dict().items() if name in names}
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight"]:
        raise RuntimeError(f"weights left out: missing {missing}, unexpected {unexpected}")
    theirs.tie_weights()  # lm_head reads embed_tokens, as our head reads our embedding
    device = model.embedding.weight.device
    return theirs.to(device=device, dtype=torch.float32).eval()
