"""Generate the tiny Qwen2-Audio checkpoint (Whisper-style audio encoder + projector + Qwen2 LM).

Same classes, processor (WhisperFeatureExtractor + tokenizer) and chat template as
Qwen/Qwen2-Audio-7B-Instruct, with tiny widths. The feature extractor's window is 5 s instead of
30 s (the encoder's positions follow it), so a clip costs at most 125 audio tokens; longer clips are
refused at the API, as the real model would silently truncate them.

    python -m llm_node.tiny_models qwen2-audio
"""

from __future__ import annotations

from pathlib import Path

from llm_node.tiny_models.tokenizer import build_bpe_tokenizer, widen_init

CHAT_TEMPLATE = (
    "{% set audio_count = namespace(value=0) %}"
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'audio' %}{% set audio_count.value = audio_count.value + 1 %}"
    "Audio {{ audio_count.value }}: <|audio_bos|><|AUDIO|><|audio_eos|>\n"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|audio_bos|>", "<|audio_eos|>", "<|AUDIO|>"]
CHUNK_SECONDS = 5
"""The feature extractor's window; the encoder has CHUNK_SECONDS * 50 positions (100 mel frames/s, stride 2)."""


def generate(out: Path, vocab_size: int = 1024, seed: int = 0, std: float = 0.15) -> Path:
    import torch
    from transformers import (
        Qwen2AudioConfig,
        Qwen2AudioForConditionalGeneration,
        Qwen2AudioProcessor,
        WhisperFeatureExtractor,
    )

    out.mkdir(parents=True, exist_ok=True)
    tok = build_bpe_tokenizer(vocab_size, SPECIAL_TOKENS, CHAT_TEMPLATE, eos="<|im_end|>", pad="<|endoftext|>",
                              extra_special_tokens={"audio_token": "<|AUDIO|>", "audio_bos_token": "<|audio_bos|>",
                                                    "audio_eos_token": "<|audio_eos|>"})
    ids = tok.convert_tokens_to_ids
    audio = dict(num_mel_bins=80, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, d_model=32,
                 max_source_positions=CHUNK_SECONDS * 50)
    text = dict(model_type="qwen2", vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                tie_word_embeddings=False, pad_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
                bos_token_id=ids("<|endoftext|>"))
    config = Qwen2AudioConfig(audio_config=audio, text_config=text, audio_token_id=ids("<|AUDIO|>"))
    torch.manual_seed(seed)
    model = Qwen2AudioForConditionalGeneration(config).eval()
    widen_init(model, std, skip=("audio_tower",))
    model.generation_config.eos_token_id = [ids("<|im_end|>"), ids("<|endoftext|>")]
    model.generation_config.pad_token_id = ids("<|endoftext|>")
    features = WhisperFeatureExtractor(feature_size=80, sampling_rate=16000, hop_length=160, chunk_length=CHUNK_SECONDS,
                                       n_fft=400, return_attention_mask=True)
    processor = Qwen2AudioProcessor(feature_extractor=features, tokenizer=tok, chat_template=CHAT_TEMPLATE)
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    return out
