"""Automatic checks for the exercises of the notebooks.

Each ``check_*`` function takes the learner's function or module, runs it on
small seeded cases against the package's reference implementation, and either
prints one line saying it passed or raises ``CheckFailed`` (an
``AssertionError``) whose message says, in plain words, the first thing that
differs and what was expected instead. An exercise not attempted yet (the
student edition's stubs raise ``NotImplementedError``) is reported, not raised.

One module per notebook: ``checks.nb01`` for notebook 01, and so on; every
check is re-exported here, the same function under both names.
"""

from ._common import CheckFailed, NotAttempted
from .nb01 import check_attention_entropy, check_colleague_bugs, check_entropy_limits, check_softmax
from .nb01a import check_jacobian_norm, check_tempered_jacobian
from .nb02 import check_masked_softmax, check_packed_mask, check_padding_mask
from .nb03 import (
    check_average_heads,
    check_expand_kv_heads,
    check_expand_valid_lens,
    check_split_fused_qkv,
    check_transpose_output,
    check_transpose_qkv,
    check_transpose_qkv_seq_first,
)
from .nb04 import check_head_off, check_mha_forward, check_num_params, check_peak_prediction, check_torch_mha_params
from .nb04a import check_cross_attention_flops, check_online_attention
from .nb05 import check_decoder_mask, check_greedy_decode, check_masked_loss_and_accuracy, check_to_torch_attention
from .nb05a import check_load_predictions
from .nb06 import (
    check_cell_average,
    check_duplicate_token_score,
    check_induction_score,
    check_normalized_entropy,
    check_previous_token_score,
    check_torch_head_maps,
)
from .nb07 import check_delta_loss, check_head_importance, check_params_after_pruning, check_pruning_order
from .nb08 import check_fixed_attention, check_smoke_predictions
from .nb09 import check_ablation_change, check_accuracy_at_1, check_sep_share
from .nb10 import check_merge_states, check_tile_gradients
from .nb11 import check_cache_size, check_cached_forward, check_chunk_step
from .nb12 import check_half_layout_weights, check_rope_half, check_rotary_step
from .nb13 import check_group_spread, check_grouped_attention, check_pool_kv_heads
from .nb14 import check_drop_group, check_induction_heads, check_perplexity

__all__ = [
    "CheckFailed",
    "NotAttempted",
    "check_softmax",
    "check_colleague_bugs",
    "check_attention_entropy",
    "check_entropy_limits",
    "check_packed_mask",
    "check_padding_mask",
    "check_masked_softmax",
    "check_transpose_qkv",
    "check_transpose_qkv_seq_first",
    "check_transpose_output",
    "check_expand_valid_lens",
    "check_split_fused_qkv",
    "check_expand_kv_heads",
    "check_average_heads",
    "check_tempered_jacobian",
    "check_jacobian_norm",
    "check_mha_forward",
    "check_num_params",
    "check_torch_mha_params",
    "check_head_off",
    "check_peak_prediction",
    "check_cross_attention_flops",
    "check_online_attention",
    "check_decoder_mask",
    "check_masked_loss_and_accuracy",
    "check_greedy_decode",
    "check_to_torch_attention",
    "check_load_predictions",
    "check_normalized_entropy",
    "check_cell_average",
    "check_previous_token_score",
    "check_induction_score",
    "check_duplicate_token_score",
    "check_torch_head_maps",
    "check_head_importance",
    "check_pruning_order",
    "check_params_after_pruning",
    "check_delta_loss",
    "check_fixed_attention",
    "check_smoke_predictions",
    "check_ablation_change",
    "check_sep_share",
    "check_accuracy_at_1",
    "check_merge_states",
    "check_tile_gradients",
    "check_cache_size",
    "check_cached_forward",
    "check_chunk_step",
    "check_rope_half",
    "check_rotary_step",
    "check_half_layout_weights",
    "check_pool_kv_heads",
    "check_grouped_attention",
    "check_group_spread",
    "check_induction_heads",
    "check_drop_group",
    "check_perplexity",
]
