"""Pick the next token of each sequence in a batch, each with its own sampling parameters.

Greedy rows (temperature 0) take the argmax. Other rows scale by 1/temperature, keep the smallest set
of tokens whose probability mass reaches top_p, and draw from it with the request's generator.

A seeded request draws its token at output index i from a generator seeded with (seed, i). The draw
then depends only on the seed and the index, not on what ran before it on which engine, so a seeded
request gives the same tokens on a combined engine and across a prefill -> decode hand-off.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from coordinator.protocol.logprobs import TokenLogprobs
from coordinator.protocol.messages import SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15
_SEED_MASK = (1 << 63) - 1


def make_generator(seed: int | None) -> torch.Generator:
    """A per-request generator: from `seed`, or from fresh OS entropy when there is none."""
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed & _SEED_MASK)
    return generator


def reseed_for_index(generator: torch.Generator, seed: int | None, index: int) -> torch.Generator:
    """Re-seed a seeded request's generator for output token `index`; unseeded generators run on."""
    if seed is not None:
        generator.manual_seed(((seed & _SEED_MASK) * _SEED_MIX + index) & _SEED_MASK)
    return generator


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero every token outside the smallest top set whose mass reaches `top_p` (the top token always stays)."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    drop = mass_before >= top_p
    drop[..., 0] = False  # explicitly: a top_p below float32's range (1e-112) compares as 0 and would drop it
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_probs)


MIN_TEMPERATURE = 1e-5
"""Below this a temperature is treated as 0 (greedy), as its limit is."""


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator],
) -> list[int]:
    """One token id per row of `logits` [B, vocab]; row i uses params[i] and generators[i]."""
    if logits.dim() != 2 or logits.shape[0] != len(params) or len(params) != len(generators):
        raise ValueError(
            f"logits {tuple(logits.shape)} need one row per request: {len(params)} params, {len(generators)} generators"
        )
    tokens: list[int] = logits.argmax(-1).tolist()
    for i, p in enumerate(params):
        if p.temperature < MIN_TEMPERATURE:  # dividing by ~0 overflows to inf and NaN; the limit is greedy
            continue
        # Generators live on the CPU, so sampled rows are drawn there.
        probs = torch.softmax(logits[i].float().cpu() / p.temperature, dim=-1)
        probs = top_p_filter(probs, p.top_p)
        tokens[i] = int(torch.multinomial(probs, 1, generator=generators[i]).item())
    return tokens


def token_logprobs(logits: torch.Tensor, tokens: Sequence[int], params: Sequence[SamplingParams]
                   ) -> list[TokenLogprobs | None]:
    """Each row's chosen token's log-probability and its `params[i].logprobs` most likely tokens; None for
    rows that did not ask. Taken from the raw logits the token was sampled from (log_softmax in float32,
    before temperature and top_p), as vLLM does by default: they describe the model, not the sampler."""
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    out: list[TokenLogprobs | None] = [None] * len(params)
    if not rows:
        return out
    index = torch.tensor(rows, device=logits.device)
    logprobs = torch.log_softmax(logits.index_select(0, index).float(), dim=-1)
    chosen = logprobs.gather(1, torch.tensor([[tokens[i]] for i in rows], device=logits.device))[:, 0].tolist()
    k = max(params[i].logprobs for i in rows)
    top = logprobs.topk(k, dim=-1)
    top_values, top_ids = top.values.tolist(), top.indices.tolist()
    for n, i in enumerate(rows):
        want = params[i].logprobs
        out[i] = TokenLogprobs(token_id=tokens[i], logprob=chosen[n],
                               top=tuple(zip(top_ids[n][:want], top_values[n][:want])))
    return out
