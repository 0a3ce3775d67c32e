"""Check for the exercise of the optional deep dive 01a (the softmax Jacobian).

The learner writes the Jacobian of a softmax *with a temperature* from its weights alone. The reference is
computed by autograd from the scores, so the formula has to be right, not merely equal to a formula shown in
the notebook; typical mistakes (no chain-rule factor, multiplying by the temperature, a missing outer product,
a version that only works for one row) are named.
"""

from __future__ import annotations

import torch

from ._common import CheckFailed, call, diagnose, expect_shape, expect_tensor, friendly, passed

__all__ = ["check_tempered_jacobian"]

# (leading axes, number of keys, temperature): one row, a batch, a batch with a head axis.
_CASES = [((), 4, 0.5), ((3,), 5, 2.0), ((2, 3), 6, 0.25)]
_BATCH_HINT = (
    " (torch.diag and torch.outer take a single row, but p may have leading axes (..., K): "
    "use a batched way to put p on a diagonal, and broadcasting for the products p_i p_j)"
)


def _reference(scores: torch.Tensor, temperature: float) -> torch.Tensor:
    """dp/ds for p = softmax(s / temperature), one (K, K) matrix per row of ``scores``, by autograd."""
    rows = scores.reshape(-1, scores.shape[-1])  # (N, K)
    jac = torch.func.vmap(torch.func.jacrev(lambda s: torch.softmax(s / temperature, dim=-1)))(rows)  # (N, K, K)
    return jac.reshape(*scores.shape, scores.shape[-1])


@friendly
def check_tempered_jacobian(fn) -> None:
    """``fn(p, temperature)``: p (..., K) = softmax(s / temperature) -> dp/ds, (..., K, K)."""
    for seed, (lead, keys, temperature) in enumerate(_CASES):
        scores = torch.randn(*lead, keys, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        p = torch.softmax(scores / temperature, dim=-1)  # (..., K)
        case = f"weights of shape {tuple(p.shape)}, temperature {temperature}"
        actual = expect_tensor(call(fn, p.clone(), temperature, case=case, hint=_BATCH_HINT), case)
        expected = _reference(scores, temperature)  # (..., K, K)
        if lead and tuple(actual.shape) == (keys, keys):
            raise CheckFailed(f"{case}: got one (K, K) matrix for a batch of rows; build one per row, {expected.shape}")
        expect_shape(actual, expected.shape, case)
        plain = torch.diag_embed(p) - p[..., :, None] * p[..., None, :]  # the Jacobian without a temperature
        mistakes = [
            (
                f"this is the Jacobian of softmax(s), without the temperature: p = softmax(s / τ) depends on s "
                f"through s / τ, so the chain rule multiplies by 1/τ = {1 / temperature:g}",
                plain,
            ),
            ("multiplied by the temperature; by the chain rule, s / τ contributes a factor 1/τ", plain * temperature),
            (
                "only the diagonal: changing s_j also changes every other weight through the denominator "
                "(the −p_i p_j terms)",
                torch.diag_embed(p) / temperature,
            ),
            ("the sign is flipped: the diagonal entries p_i (1 − p_i) / τ are positive", -plain / temperature),
        ]
        diagnose(actual.detach().double().cpu(), expected, mistakes, case, atol=1e-8, rtol=1e-6)
    passed("check_tempered_jacobian", len(_CASES))
