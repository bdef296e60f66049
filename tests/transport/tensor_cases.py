"""The tensors every backend must move bit-exact: embeddings and KV blocks of several dtypes and shapes."""

import torch


def cases() -> dict[str, dict[str, torch.Tensor]]:
    """Request id -> named tensors; deterministic, so two processes build the same ones."""
    g = torch.Generator().manual_seed(11)
    return {
        "embeds": {
            "image_embeds": torch.randn(576, 1024, generator=g).to(torch.bfloat16),  # ~1.2 MB, one image
            "audio_embeds": torch.randn(3, 7, 33, generator=g).to(torch.float16),
            "ids": torch.arange(12, dtype=torch.int64).reshape(3, 4).t(),  # not contiguous
            "mask": torch.tensor([0, 1, 255], dtype=torch.uint8),
            "empty": torch.empty(0, 8, dtype=torch.float16),
        },
        "kv": {
            "kv": torch.randn(4, 2, 8, 256, 64, generator=g).to(torch.float16),  # 4 layers x (k, v): 8 MB
            "positions": torch.arange(256, dtype=torch.int32),
        },
        "fp32": {"x": torch.randn(1 << 20, generator=g)},  # 4 MB
        "scalar": {"t": torch.tensor(2.5)},
    }
