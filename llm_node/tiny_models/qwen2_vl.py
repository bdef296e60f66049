"""Generate the tiny Qwen2-VL checkpoint (dynamic-resolution vision tower + M-RoPE language model).

Same architecture classes, image processor and chat template as Qwen/Qwen2-VL-*-Instruct, with tiny
widths and a small BPE vocabulary. The tokenizer (with the chat template) and the PIL image processor
are saved as separate components, as in a hub checkpoint: transformers' Qwen2VLProcessor insists on a
torchvision video processor, which this project does not need (video frames go through the image
processor's resize and the vision tower's temporal patches; see encode_node/qwen2_vl_encoder.py).
The pixel bounds are small, so an image costs 4 to 36 tokens.

    python -m llm_node.tiny_models qwen2-vl
"""

from __future__ import annotations

from pathlib import Path

from llm_node.tiny_models.tokenizer import build_bpe_tokenizer, widen_init

# Qwen2-VL-Instruct's template (without the optional "Picture n:" ids).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]
MIN_PIXELS = 28 * 28 * 4
MAX_PIXELS = 28 * 28 * 36


def generate(out: Path, vocab_size: int = 1024, seed: int = 0, std: float = 0.15) -> Path:
    import torch
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration, Qwen2VLImageProcessorPil

    out.mkdir(parents=True, exist_ok=True)
    tok = build_bpe_tokenizer(vocab_size, SPECIAL_TOKENS, CHAT_TEMPLATE, eos="<|im_end|>", pad="<|endoftext|>",
                              extra_special_tokens={"image_token": "<|image_pad|>", "video_token": "<|video_pad|>"})
    ids = tok.convert_tokens_to_ids
    # head_dim 32: vLLM's CPU attention takes 32, 64, 80, 96, 112, 128, ... (16 does not load there);
    # mrope_section splits head_dim / 2 rotary pairs over (t, h, w).
    text = dict(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [4, 6, 6]},
                tie_word_embeddings=False, pad_token_id=ids("<|endoftext|>"), eos_token_id=ids("<|im_end|>"),
                bos_token_id=ids("<|endoftext|>"))
    vision = dict(depth=2, embed_dim=32, hidden_size=128, num_heads=2, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2)
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                           video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                           vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config).eval()
    widen_init(model, std, skip=("visual",))
    model.generation_config.eos_token_id = [ids("<|im_end|>"), ids("<|endoftext|>")]
    model.generation_config.pad_token_id = ids("<|endoftext|>")
    image_processor = Qwen2VLImageProcessorPil(size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
                                               patch_size=14, merge_size=2, temporal_patch_size=2)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    image_processor.save_pretrained(out)
    return out
