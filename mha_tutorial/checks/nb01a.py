"""Checks for the exercises of the optional deep dive 01a (the softmax Jacobian).

Exercise 1: the Jacobian of a softmax *with a temperature* from its weights alone. The reference is computed by
autograd from the scores, so the formula has to be right, not merely equal to a formula shown in the notebook;
typical mistakes (no chain-rule factor, multiplying by the temperature, a missing outer product, a version that
only works for one row) are named.

Exercise 2: the exact Frobenius norm of the Jacobian from sums over the weights, without a (K, K) matrix. The
reference is the norm of the Jacobian built by autograd; the named helpers that build a (K, K) matrix are refused
(a broadcast outer product is not detected), and the usual slips of the expansion are named.
"""

from __future__ import annotations

import torch

from ._common import CheckFailed, call, diagnose, expect_shape, expect_tensor, friendly, passed, refusing

__all__ = ["check_tempered_jacobian", "check_jacobian_norm"]

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


# (leading axes, number of keys, score scale): a flat row, a batch of peaked rows, a batch of near one-hot rows.
_NORM_CASES = [((), 4, 1.0), ((3,), 6, 4.0), ((2, 3), 16, 12.0)]
_BUILDS_THE_MATRIX = {
    f: f"torch.func.{f.__name__} (it builds the (K, K) Jacobian)" for f in (torch.func.jacrev, torch.func.jacfwd)
}
_BUILDS_THE_MATRIX_C = {
    name: f"torch.{name} (it builds a (K, K) matrix)" for name in ("diag", "diag_embed", "outer", "ger", "eye")
}


@friendly
def check_jacobian_norm(fn) -> None:
    """``fn(p)``: weights p (..., K) -> the Frobenius norm of dp/ds = diag(p) - p p^T, shape (...)."""
    for seed, (lead, keys, scale) in enumerate(_NORM_CASES):
        scores = scale * torch.randn(
            *lead, keys, generator=torch.Generator().manual_seed(10 + seed), dtype=torch.float64
        )
        p = torch.softmax(scores, dim=-1)  # (..., K)
        case = f"weights of shape {tuple(p.shape)}, largest weight up to {p.max().item():.3g}"
        with refusing(_BUILDS_THE_MATRIX, _BUILDS_THE_MATRIX_C):
            actual = expect_tensor(call(fn, p.clone(), case=case), case)
        rows = scores.reshape(-1, keys)  # (N, K)
        jac = torch.func.vmap(torch.func.jacrev(lambda s: torch.softmax(s, dim=-1)))(rows)  # (N, K, K)
        expected = jac.flatten(1).norm(dim=-1).reshape(lead)  # (...)
        expect_shape(actual, expected.shape, case)
        sq, cube = (p**2).sum(-1), (p**3).sum(-1)  # (...): sum of p_i^2, sum of p_i^3
        leftover = 1 - p.max(dim=-1).values  # (...)
        losers_sq = sq - p.max(dim=-1).values ** 2  # (...): sum of the losers' p_j^2
        mistakes = [
            ("that is ‖J‖², the sum of the squared entries: take its square root", expected**2),
            (
                "the cross term is missing: expanding ‖diag(p) − p pᵀ‖² gives −2 × ⟨diag(p), p pᵀ⟩ = −2 Σ p_i³",
                (sq + sq**2).sqrt(),
            ),
            (
                "the cross term counts twice ((a − b)² = a² − 2ab + b²): −2 Σ p_i³, not −Σ p_i³",
                (sq - cube + sq**2).sqrt(),
            ),
            ("the last term is missing: ‖p pᵀ‖² = Σ_ij p_i² p_j² = (Σ p_i²)²", (sq - 2 * cube).clamp_min(0).sqrt()),
            (
                "this is the near-saturation approximation √(ε² + 3 Σ p_j²) of section 3; "
                "the exercise asks for the exact norm, which holds for flat rows too",
                (leftover**2 + 3 * losers_sq).sqrt(),
            ),
            ("that is the leftover weight 1 − max p, not ‖J‖ (near saturation ‖J‖ is 1 to 2 times it)", leftover),
        ]
        diagnose(actual.detach().double().cpu(), expected, mistakes, case, atol=1e-10, rtol=1e-6)
    passed("check_jacobian_norm", len(_NORM_CASES))
