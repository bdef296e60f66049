"""A small byte-level BPE tokenizer with a model family's special tokens, built offline.

Every tiny checkpoint needs a tokenizer whose special tokens and chat template match the real
family's (Qwen's `<|im_start|>`, `<|image_pad|>`, `<|AUDIO|>`...), so prompt building and the
processors run the same code as with real weights. The corpus is the LLaVA generator's.
"""

from __future__ import annotations

from llm_node.tiny_model import _corpus


def build_bpe_tokenizer(vocab_size: int, special_tokens: list[str], chat_template: str, *, eos: str, pad: str,
                        extra_special_tokens: dict[str, str] | None = None, bos: str | None = None,
                        unk: str | None = None, model_max_length: int = 2048):
    """A PreTrainedTokenizerFast whose first ids are `special_tokens` (never split by BPE)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, unk_token=unk, pad_token=pad,
        extra_special_tokens=extra_special_tokens or {}, chat_template=chat_template,
        model_max_length=model_max_length,
    )


def widen_init(model, std: float, skip: tuple[str, ...]) -> None:
    """Re-draw every matrix outside `skip` with a wider normal: the default std 0.02 makes a tiny
    random model repeat one token, and the exactness tests need varied, input-dependent output."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and not any(s in name for s in skip):
                p.normal_(0.0, std)
