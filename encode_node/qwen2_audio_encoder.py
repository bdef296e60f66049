"""The Qwen2-Audio encoder: Whisper log-mel features, the audio tower and the projector, batched.

Clips arrive as float32 mono PCM already at the feature extractor's rate (the coordinator decoded
and resampled them, because the prompt's audio-token count depends on the resampled length). Each
clip is padded to the extractor's window, as Qwen2AudioProcessor does, and masked in the tower's
attention; the valid rows of the projected output are that clip's embeddings, in the same way
Qwen2AudioModel.forward selects them.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from coordinator.protocol.messages import EncodedMedia, Modality
from encode_node.encoded import EncodedBatch, check_modality, decode_each, load_media_side, split_per_request
from native.pinned import HostStaging


def pcm_from_bytes(raw: bytes) -> np.ndarray:
    if len(raw) % 4:
        raise ValueError(f"audio is {len(raw)} bytes, not whole float32 samples")
    return np.frombuffer(raw, dtype="<f4").astype(np.float32)


class Qwen2AudioEncoder:
    modalities = frozenset({"audio"})

    def __init__(self, model_dir: Path, device: str = "cpu", dtype: torch.dtype = torch.float32):
        from transformers import AutoFeatureExtractor

        self.features = AutoFeatureExtractor.from_pretrained(model_dir)
        self.model, config = load_media_side("Qwen2AudioForConditionalGeneration", model_dir, device, dtype)
        self.device, self.dtype = device, dtype
        self.staging = HostStaging(device)
        self.hidden_size = config.text_config.hidden_size
        self.placeholder_ids = frozenset({config.audio_token_id})

    @torch.inference_mode()
    def encode(self, items_per_request: list[list[bytes]], modality: Modality = "audio") -> EncodedBatch:
        check_modality(self, modality)
        t0 = time.perf_counter()
        decoded, errors = decode_each(items_per_request, pcm_from_bytes, "audio")
        flat = [a for clips in decoded if clips for a in clips]
        feats = self._embed(flat) if flat else []
        media, i = [], 0
        for clips in decoded:
            n = len(clips or [])
            media.append([EncodedMedia(modality="audio", num_tokens=f.shape[0]) for f in feats[i : i + n]])
            i += n
        return EncodedBatch(split_per_request(decoded, feats, self.hidden_size), errors, time.perf_counter() - t0,
                            media)

    def _embed(self, clips: list[np.ndarray]) -> list[torch.Tensor]:
        from transformers.masking_utils import create_bidirectional_mask

        fe = self.features
        inputs = fe(clips, sampling_rate=fe.sampling_rate, return_attention_mask=True, padding="max_length",
                    return_tensors="pt")
        features, mask = inputs["input_features"].to(self.device, self.dtype), inputs["attention_mask"].to(self.device)
        tower = self.model.audio_tower
        feat_lengths, out_lengths = tower._get_feat_extract_output_lengths(mask.sum(-1))
        seq = (features.shape[-1] - 2) // 2 + 1
        valid = (torch.arange(seq, device=self.device)[None, :] < feat_lengths[:, None]).long()
        probe = torch.zeros(len(clips), seq, 1, device=self.device, dtype=self.dtype)  # the mask's dtype and shape
        attention = create_bidirectional_mask(config=tower.config, attention_mask=valid, inputs_embeds=probe)
        hidden = tower(features, attention_mask=attention).last_hidden_state
        projected = self.model.multi_modal_projector(hidden)
        return self.staging.to_host([projected[i, : int(n)] for i, n in enumerate(out_lengths)])
