"""The one comparator of every exactness test and its negative controls."""

from __future__ import annotations


def logit_mismatches(name: str, ref_tokens: list[int], ref_logits: list, tokens: list[int], logits: list,
                     atol: float = 1e-4) -> list[str]:
    """Every way `tokens`/`logits` differ from a generate() reference; [] when they match.

    The one comparator of the exactness tests and their negative controls: tokens must be equal and
    every step's logits within `atol` (greedy tokens alone miss position bugs).
    """
    problems = []
    if tokens != ref_tokens:
        problems.append(f"{name}: tokens {tokens} != reference {ref_tokens}")
    if len(logits) != len(ref_logits):
        problems.append(f"{name}: {len(logits)} logit steps != reference {len(ref_logits)}")
    for i, (got, want) in enumerate(zip(logits, ref_logits)):
        diff = (got - want).abs().max().item() if got.shape == want.shape else float("inf")
        if not diff < atol:
            problems.append(f"{name}: step {i} logits max-abs-diff {diff:.3g} >= {atol}")
    return problems
