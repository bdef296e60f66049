"""Generate the tiny LLaVA checkpoint that the embedded default serves.

No weights can be downloaded here, so the project ships a randomly initialised model of the real
architecture (CLIP vision tower + projector + Llama) with a byte-level BPE tokenizer and a chat
template, saved the way a hub checkpoint is. The nodes then load it with `from_pretrained(dir)`, so
the same loading code serves real weights from a local path.

    python -m llm_node.tiny_model --out coordinator/assets/tiny-llava
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<image>{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '</s>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

# A small corpus so BPE learns real merges; byte-level fallback covers every other input.
_WORDS = (
    "the a an image picture photo shows of with and in on at red green blue yellow black white "
    "cat dog bird car tree house sky sea mountain street person people small large bright dark "
    "what is this describe tell me about color shape left right top bottom center there are two "
    "three many one it looks like scene outdoor indoor day night water road building window "
    "system user assistant you are helpful answer question please briefly detail"
).split()

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<image>", "<|system|>", "<|user|>", "<|assistant|>"]


def _corpus() -> list[str]:
    lines = []
    for i, w in enumerate(_WORDS):
        nxt = _WORDS[(i * 7 + 3) % len(_WORDS)]
        lines.append(f"{w} {nxt} {w}s {nxt}ing, {w.capitalize()} {nxt}. {i} {i * 13}")
    return lines * 4


def build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"},
        chat_template=CHAT_TEMPLATE,
        model_max_length=2048,
    )


def build_model(vocab_size: int, image_token_id: int, pad_id: int, eos_id: int, bos_id: int, seed: int, std: float,
                text_hidden: int = 128, text_layers: int = 4):
    import torch
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    vision = CLIPVisionConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        image_size=224, patch_size=16, projection_dim=64,
    )
    text = LlamaConfig(
        vocab_size=vocab_size, hidden_size=text_hidden, intermediate_size=2 * text_hidden, num_hidden_layers=text_layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        pad_token_id=pad_id, bos_token_id=bos_id, eos_token_id=eos_id, tie_word_embeddings=False,
    )
    config = LlavaConfig(
        vision_config=vision, text_config=text, image_token_id=image_token_id,
        vision_feature_layer=-2, vision_feature_select_strategy="default", projector_hidden_act="gelu",
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    # Default init (std 0.02) makes a tiny random model repeat one token; a wider init gives
    # varied, image-dependent output, which the exactness tests need to mean anything.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and "vision_tower" not in name:
                p.normal_(0.0, std)
    model.generation_config.pad_token_id = pad_id
    model.generation_config.eos_token_id = eos_id
    model.generation_config.bos_token_id = bos_id
    return model


def generate(out: Path, vocab_size: int = 1024, seed: int = 0, std: float = 0.15, text_hidden: int = 128,
             text_layers: int = 4) -> Path:
    """Write the checkpoint; a larger language model (text_hidden, text_layers) makes benchmarks'
    decode steps cost compute rather than Python overhead, as on a real GPU."""
    from transformers import CLIPImageProcessorPil, LlavaProcessor

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(vocab_size)
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224},
    )
    processor = LlavaProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=16,
        vision_feature_select_strategy="default", chat_template=CHAT_TEMPLATE,
        num_additional_image_tokens=1,
    )
    ids = tokenizer.convert_tokens_to_ids
    model = build_model(
        len(tokenizer), ids("<image>"), ids("<pad>"), ids("</s>"), ids("<s>"), seed, std, text_hidden, text_layers,
    )
    model.save_pretrained(out, safe_serialization=True)
    _nest_vision_tower(out / "model.safetensors")
    processor.save_pretrained(out)
    return out


def _nest_vision_tower(path: Path) -> None:
    """Store the CLIP tower under `vision_tower.vision_model.`, as hub LLaVA checkpoints do: transformers
    loads either layout, vLLM's LLaVA only that one."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(path, "pt") as f:
        metadata = f.metadata()
    prefix, nested = "vision_tower.", "vision_tower.vision_model."
    weights = {nested + k[len(prefix):] if k.startswith(prefix) and not k.startswith(nested) else k: v
               for k, v in load_file(path).items()}
    save_file(weights, path, metadata=metadata)


def main(argv: list[str] | None = None) -> int:
    from coordinator.protocol.models import DEFAULT_MODEL_DIR

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_MODEL_DIR, help="directory to write (default: %(default)s)")
    parser.add_argument("--vocab-size", type=int, default=1024, help="BPE vocabulary size (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed for the weights (default: %(default)s)")
    parser.add_argument("--std", type=float, default=0.15, help="init std of language-model weights (default: %(default)s)")
    parser.add_argument("--text-hidden", type=int, default=128, help="language model width (default: %(default)s)")
    parser.add_argument("--text-layers", type=int, default=4, help="language model depth (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.text_hidden < 8 or args.text_hidden % 4 or args.text_layers < 1:
        parser.error("--text-hidden must be a multiple of 4 (>= 8) and --text-layers >= 1")
    path = generate(args.out, args.vocab_size, args.seed, args.std, args.text_hidden, args.text_layers)
    size = sum(f.stat().st_size for f in path.iterdir()) / 1e6
    print(f"wrote {path} ({size:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
