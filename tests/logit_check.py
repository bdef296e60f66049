"""The comparators of every exactness test and its negative controls: logits, and reported logprobs."""

from __future__ import annotations

import torch


def logit_mismatches(name: str, ref_tokens: list[int], ref_logits: list, tokens: list[int], logits: list,
                     atol: float = 1e-4, normalize: bool = False) -> list[str]:
    """Every way `tokens`/`logits` differ from a generate() reference; [] when they match.

    The one comparator of the exactness tests and their negative controls: tokens must be equal and
    every step's logits within `atol` (greedy tokens alone miss position bugs). `normalize` compares
    log_softmax of both sides: the vLLM engine reports log-probabilities, which are the logits up to a
    per-step constant (log_softmax of log-probabilities is themselves).
    """
    import torch
    problems = []
    if tokens != ref_tokens:
        problems.append(f"{name}: tokens {tokens} != reference {ref_tokens}")
    if len(logits) != len(ref_logits):
        problems.append(f"{name}: {len(logits)} logit steps != reference {len(ref_logits)}")
    for i, (got, want) in enumerate(zip(logits, ref_logits)):
        if normalize:
            got, want = torch.log_softmax(got.float(), -1), torch.log_softmax(want.float(), -1)
        diff = (got - want).abs().max().item() if got.shape == want.shape else float("inf")
        if not diff < atol:
            problems.append(f"{name}: step {i} logits max-abs-diff {diff:.3g} >= {atol}")
    return problems


def logprob_mismatches(name: str, tokens: list[int], logprobs: list, ref_logits: list, k: int,
                       atol: float = 1e-5) -> list[str]:
    """Every way an engine's reported logprobs (TokenLogprobs per token) differ from log_softmax (float32) of
    `ref_logits` [vocab] per step: the generated token's logprob, the k top ids in order and their logprobs."""
    problems = []
    if len(logprobs) != len(tokens):
        problems.append(f"{name}: {len(logprobs)} logprob entries for {len(tokens)} tokens")
    for step, (token, lp, logits) in enumerate(zip(tokens, logprobs, ref_logits)):
        ref = torch.log_softmax(logits.float(), dim=-1)
        top = ref.topk(k)
        if lp.token_id != token:
            problems.append(f"{name} step {step}: entry for token {lp.token_id}, generated {token}")
        if not abs(lp.logprob - ref[token].item()) < atol:
            problems.append(f"{name} step {step}: logprob {lp.logprob} != {ref[token].item()}")
        if [i for i, _ in lp.top] != top.indices.tolist():
            problems.append(f"{name} step {step}: top ids {[i for i, _ in lp.top]} != {top.indices.tolist()}")
        diffs = [abs(v - w) for (_, v), w in zip(lp.top, top.values.tolist())]
        if diffs and not max(diffs) < atol:
            problems.append(f"{name} step {step}: top logprobs off by {max(diffs):.3g}")
    return problems
