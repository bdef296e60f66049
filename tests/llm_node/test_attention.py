"""gqa_sdpa (llm_node/attention.py): masked grouped-query attention on a CPU without copying the keys gives the
same bits as transformers' "sdpa", which repeats every key and value head first."""

from __future__ import annotations

import torch
from transformers import LlavaForConditionalGeneration
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from coordinator.protocol.models import DEFAULT_MODEL_DIR
from llm_node.attention import NAME, gqa_sdpa, use_gqa_sdpa
from llm_node.model_runner import ModelRunner


def _attention_module(model):
    module = model.model.language_model.layers[0].self_attn
    assert module.num_key_value_groups > 1  # the tiny LLaVA has 4 query heads and 2 key/value heads
    return module


def test_masked_decode_and_prefill_attention_match_transformers_sdpa_bit_for_bit(tiny):
    module = _attention_module(tiny[0])
    gen = torch.Generator().manual_seed(0)
    for batch, q_len, kv_len in [(5, 1, 40), (3, 17, 17)]:  # a decode step, a right-padded prefill
        query = torch.randn(batch, 4, q_len, 32, generator=gen)
        key, value = (torch.randn(batch, 2, kv_len, 32, generator=gen) for _ in range(2))
        mask = torch.ones(batch, 1, q_len, kv_len, dtype=torch.bool).tril(kv_len - q_len)
        mask[0, :, :, : kv_len // 3] = False  # padding in one row
        ours, _ = gqa_sdpa(module, query, key, value, mask, scaling=32 ** -0.5)
        theirs, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=32 ** -0.5)
        assert ours.shape == theirs.shape == (batch, q_len, 4, 32)
        assert torch.equal(ours, theirs)
        unmasked, _ = gqa_sdpa(module, query, key, value, torch.ones_like(mask), scaling=32 ** -0.5)
        assert not torch.equal(unmasked, ours)  # the mask is applied, not dropped


def test_the_runner_switches_a_cpu_sdpa_model_and_its_padded_batches_keep_their_logits():
    plain = LlavaForConditionalGeneration.from_pretrained(DEFAULT_MODEL_DIR, attn_implementation="sdpa").eval()
    switched = LlavaForConditionalGeneration.from_pretrained(DEFAULT_MODEL_DIR, attn_implementation="sdpa").eval()
    runner = ModelRunner(switched)
    assert runner.gqa_sdpa and switched.config.get_text_config(decoder=True)._attn_implementation == NAME
    prompts = [[1, 5, 9, 12, 30, 31, 40, 41, 42], [1, 7, 8]]  # right-padded: a masked prefill
    with torch.inference_mode():
        ids = torch.tensor([p + [0] * (9 - len(p)) for p in prompts])
        mask = (torch.arange(9) < torch.tensor([[9], [3]])).long()
        want = plain(input_ids=ids, attention_mask=mask).logits
        got = switched(input_ids=ids, attention_mask=mask).logits
    assert torch.equal(got, want)


def test_an_eager_model_is_left_alone():
    eager = LlavaForConditionalGeneration.from_pretrained(DEFAULT_MODEL_DIR, attn_implementation="eager").eval()
    assert not use_gqa_sdpa(eager)
    assert eager.config.get_text_config(decoder=True)._attn_implementation == "eager"
