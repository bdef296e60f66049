"""One typed message per hop of a request; JSON on Redis streams, never pickle.

    coordinator --EncodeBatch (of EncodeJobs)--> encode worker --PrefillJob--> prefill/combined worker
    prefill worker --DecodeJob--> decode worker;  any LLM worker --TokenEvent--> request stream
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from transport.wire import TensorDescriptor

Role = Literal["encode", "prefill", "decode", "combined"]
FinishReason = Literal["stop", "length", "abort", "error"]
Modality = Literal["image", "video", "audio"]


class SamplingParams(BaseModel):
    """What the engine needs to pick tokens; validated at the API, trusted downstream."""

    model_config = ConfigDict(frozen=True)

    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    """0 means greedy."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    """Stop strings; the matched string is not part of the output."""
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    return_logits: bool = False
    """Debug: attach each step's full logits to the token events (exactness tests)."""


class Timing(BaseModel):
    """Compute time a request spent in each stage, so overhead = e2e - compute can be measured."""

    encode_s: float = 0.0
    encode_batch: int = 0
    """Requests in the encoder forward pass this request was part of (0: not encoded)."""
    prefill_s: float = 0.0
    decode_s: float = 0.0
    transfer_s: float = 0.0
    marks: dict[str, float] = {}
    """Wall-clock time (time.time(), one host's clock) at each hop: received, submitted, encode_start,
    encode_end, admitted, first_token, handoff_sent, decode_admitted, finished. Copy before adding."""

    def mark(self, name: str, **update: float) -> "Timing":
        """A copy with one more mark (and any field updates)."""
        import time

        return self.model_copy(update={"marks": {**self.marks, name: time.time()}, **update})


class _Job(BaseModel):
    request_id: str
    prompt_token_ids: list[int]
    sampling: SamplingParams
    arrival: float
    """Coordinator wall-clock time the request arrived (time.time())."""
    timing: Timing = Field(default_factory=Timing)


class MediaRef(BaseModel):
    key: str
    """Redis key holding the media bytes (TTL'd): an encoded image; a video's frames packed by
    coordinator/protocol/frames.py; or audio as float32 little-endian mono PCM at the encoder's rate."""
    kind: Modality = "image"


class EncodedMedia(BaseModel):
    """What the prefill worker must know about one media item besides its embedding rows.

    The rows of all items of a request travel as one tensor in prompt order; this says how many rows
    each item owns and, for M-RoPE models (Qwen2-VL), its patch grid, from which the 3-D positions
    are built. Small and typed, so it rides in the control message, never in a pickle.

    Token-type ids (Qwen2-VL's image/video/text mask) do not travel: the prefill worker rebuilds them
    from the prompt ids (the model's image and video pad tokens) and each item's `modality`, which is
    the same information in fewer bytes; a mismatch between the two is refused (check_media).
    """

    model_config = ConfigDict(frozen=True)

    modality: Modality
    num_tokens: int = Field(ge=0)
    """Embedding rows (= placeholder tokens in the prompt) of this item."""
    grid_thw: tuple[int, int, int] | None = None
    """(temporal, height, width) in vision patches before the spatial merge (Qwen2-VL's
    image_grid_thw / video_grid_thw row); None for encoders without a grid (LLaVA, audio)."""


class EncodeJob(_Job):
    kind: Literal["encode"] = "encode"
    media: list[MediaRef]
    """One modality per request, so a micro-batch holds one modality (the encoder runs one path)."""
    prefill_worker: str | None = None
    """Pin the prefill to this worker; None lets the encode worker choose (the control point)."""

    @property
    def modality(self) -> Modality:
        """The request's one modality (the coordinator refuses requests that mix them)."""
        return self.media[0].kind if self.media else "image"


class EncodeBatch(BaseModel):
    """One micro-batch as the dispatch policy released it: the encode worker runs it as one forward."""

    kind: Literal["encode_batch"] = "encode_batch"
    jobs: list[EncodeJob]


class PrefillJob(_Job):
    kind: Literal["prefill"] = "prefill"
    embeddings: list[TensorDescriptor] = []
    """Modality embeddings in prompt order, one tensor [n_tokens, hidden]; empty for text-only."""
    media: list[EncodedMedia] = []
    """Per media item in prompt order: its rows of the embeddings and its grid; empty for text-only
    and for senders that predate it (then the rows are only checked against the placeholders)."""


class DecodeJob(_Job):
    kind: Literal["decode"] = "decode"
    output_token_ids: list[int]
    """Tokens already produced (by the prefill worker) and already streamed."""
    kv: list[TensorDescriptor]
    rope_delta: int = 0
    """M-RoPE models: position of a generated token = its index + rope_delta (computed at prefill from
    the media grids, which the decode worker never sees); 0 for plain RoPE."""


class AbortJob(BaseModel):
    kind: Literal["abort"] = "abort"
    request_id: str


Job = Annotated[Union[EncodeJob, EncodeBatch, PrefillJob, DecodeJob, AbortJob], Field(discriminator="kind")]
JOB_ADAPTER: TypeAdapter[Job] = TypeAdapter(Job)


class TokenEvent(BaseModel):
    """One entry on a request's token stream: new tokens, and on the last one why it ended."""

    token_ids: list[int] = []
    text: str = ""
    finish_reason: FinishReason | None = None
    error: str | None = None
    logits: list[str] = []
    """Debug: base64 float32 logits, one per token in token_ids (SamplingParams.return_logits)."""
    prompt_tokens: int | None = None
    timing: Timing | None = None
    worker_id: str = ""
    batch_size: int = 0
    """Sequences in the engine step that produced these tokens (observability; tests of batching)."""


class WorkerInfo(BaseModel):
    """A worker's registry entry; its liveness is a separate heartbeat key with a TTL."""

    worker_id: str
    role: Role
    tier: str = "cpu"
    """GPU tier name from the catalog, or "cpu"."""
    host: str
    pid: int
    model: str
    transport_address: str = ""
    """Where this worker's transport receiver listens ("" for encode workers)."""
    colocated_with: str | None = None
    """For a prefill worker on an encode GPU: that encode worker's id (its "local" prefill worker)."""
    started_at: float
