"""mha_tutorial: the attention code that the notebooks build, in its final form.

Notebook 01 -> attention.py, 02 -> masks.py, 03 -> heads.py and variants.py,
04 -> mha.py (and bench.py for what it costs), 05 -> tasks.py, model.py, train.py,
06 -> viz.py (the heatmap grid), maps.py (weights from a model) and head_stats.py,
07 -> pruning.py, 09 -> bert.py (a BERT-style encoder) and minilm.py (the pretrained
all-MiniLM-L6-v2 loaded into it), 10 -> flash.py (tiled attention), 11 -> kv_cache.py (decoding
with a cache); rope.py (rotary positions) and gqa.py (grouped-query attention) are Part II's next parts. Every notebook ends by checking its own code
against these; ``checks`` holds the automatic checks of the exercises.
"""

from .core.attention import DotProductAttention, masked_softmax, scaled_dot_product_attention
from .core.heads import transpose_output, transpose_qkv
from .core.kv_cache import KVCache, LayerCache, cache_bytes
from .core.masks import (
    additive_to_bool,
    bool_to_additive,
    causal_mask,
    drop_to_keep,
    keep_to_drop,
    padding_mask,
)
from .core.mha import AddNorm, MultiHeadAttention
from .core.rope import apply_rope, interleaved_to_half, rope_angles, rope_frequencies
from .core.variants import EinsumMultiHeadAttention, HeadLoopMultiHeadAttention, SeqFirstMultiHeadAttention
from .device import get_device
from .models.model import ModelConfig, build_model
from .models.tasks import get_task, load_split
from .models.train import evaluate, load_pretrained, train
from .modern.gqa import mha_to_gqa, prune_kv_groups
from .pretrained.bert import BertConfig, BertEncoder, mean_pool
from .pretrained.bert_heads import category_profile, clark_categories, head_token_stats, plot_category_profile
from .pretrained.llama import LlamaConfig, LlamaDecoder
from .pretrained.minilm import embed, load_minilm, tokenize
from .pretrained.retrieval import (
    ablation_drops,
    curve_auc,
    load_paraphrases,
    load_study,
    physical_pruning_savings,
    prunable_heads,
    random_orders,
    retrieval_accuracy,
)
from .pretrained.smollm import load_smollm, load_smollm_tokenizer, smollm_generate

__all__ = [
    "AddNorm",
    "KVCache",
    "LayerCache",
    "cache_bytes",
    "mha_to_gqa",
    "prune_kv_groups",
    "apply_rope",
    "interleaved_to_half",
    "rope_angles",
    "rope_frequencies",
    "BertConfig",
    "BertEncoder",
    "category_profile",
    "clark_categories",
    "head_token_stats",
    "plot_category_profile",
    "embed",
    "load_minilm",
    "mean_pool",
    "tokenize",
    "LlamaConfig",
    "LlamaDecoder",
    "load_smollm",
    "load_smollm_tokenizer",
    "smollm_generate",
    "ablation_drops",
    "curve_auc",
    "load_paraphrases",
    "load_study",
    "physical_pruning_savings",
    "prunable_heads",
    "random_orders",
    "retrieval_accuracy",
    "ModelConfig",
    "build_model",
    "evaluate",
    "get_task",
    "load_pretrained",
    "load_split",
    "train",
    "DotProductAttention",
    "EinsumMultiHeadAttention",
    "HeadLoopMultiHeadAttention",
    "MultiHeadAttention",
    "SeqFirstMultiHeadAttention",
    "additive_to_bool",
    "bool_to_additive",
    "causal_mask",
    "drop_to_keep",
    "get_device",
    "keep_to_drop",
    "masked_softmax",
    "padding_mask",
    "scaled_dot_product_attention",
    "transpose_output",
    "transpose_qkv",
]
__version__ = "0.2.0"
