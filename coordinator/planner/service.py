"""How long each stage's work takes on a GPU tier: the one seam between the performance model and its users.

`coordinator/planner/perf.py` implements it (measured profiles first, a roofline estimate from the
catalog otherwise); the simulator and the queueing model only ever call these four methods, so a test
can drive them with any table of times. All results are seconds of wall time on ONE GPU of `tier`
running that stage alone (no sharing); the simulator accounts for sharing itself.
"""

from __future__ import annotations

from typing import Literal, Protocol

Modality = Literal["image", "video", "audio"]


class ServiceTimes(Protocol):
    def encode_s(self, tier: str, modality: Modality, batch: int, tokens_per_item: int) -> float:
        """One encoder forward over `batch` items of one modality, each producing `tokens_per_item`
        embedding tokens (image patches after merging, video frames x patches, audio frames)."""
        ...

    def prefill_s(self, tier: str, tokens: int) -> float:
        """One prefill forward over `tokens` prompt tokens in total (text + modality embeddings,
        summed over the sequences batched together). A service may also offer `prefill_batch_s(tier,
        lengths)`, the step timed per sequence (each its own attention; PerfModel does): the simulator
        uses it for steps of several prompts where present, this where not. Likewise optional:
        `admit_s(tier, role)`, the seconds a running batch waits per request its engine admits (PerfModel
        reads it from a profile), added to the step that admits it."""
        ...

    def decode_step_s(self, tier: str, batch: int, context_tokens: int) -> float:
        """One decode step producing one token for each of `batch` sequences whose KV caches hold
        `context_tokens` tokens in total."""
        ...

    def transfer_s(self, nbytes: int, src_tier: str, dst_tier: str, same_host: bool) -> float:
        """Moving `nbytes` (embeddings or a KV cache) from a GPU of `src_tier` to one of `dst_tier`:
        over the hosts' network link, or over PCIe/NVLink when `same_host`. A service may also offer
        `kv_transfer_s` with the same arguments for a prefill worker's KV hand-off to a decode worker (PerfModel:
        a measured KV hop); the simulator uses it for those where present, this where not."""
        ...
