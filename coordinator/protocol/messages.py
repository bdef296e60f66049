"""One typed message per hop of a request; JSON on Redis streams, never pickle.

    coordinator --EncodeBatch (of EncodeJobs)--> encode worker --PrefillJob--> prefill/combined worker
    prefill worker --DecodeJob--> decode worker;  any LLM worker --TokenEvent--> request stream
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from coordinator.protocol.logprobs import MAX_TOP_LOGPROBS, PackedLogprobs, TokenLogprobs
from coordinator.protocol.roles import Role
from transport.wire import TensorDescriptor

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
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    """Return each generated token's log-probability and its `logprobs` most likely alternatives (0: the
    token's own only); None: none. Engines report the model's raw distribution (TokenLogprobs)."""


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
    attempt: int = Field(0, ge=0)
    """0 for the first run; the coordinator's n-th re-run after a worker holding the request died. Every
    TokenEvent carries it, so the coordinator ignores what a superseded run still publishes."""
    reply_to: str | None = None
    """The stream the request's TokenEvents go to (the coordinator's reply stream); None: the request's
    own stream `Keys.tokens(request_id)` (tests and tools that push jobs themselves)."""
    reply_addr: str | None = Field(None, max_length=300)
    """host:port of the coordinator's reply link (link_wire.py), which the LLM worker writes this job's
    events to while it is up, the reply stream standing in when it is not; None: the stream alone."""
    output_token_ids: list[int] = []
    """Tokens already produced and streamed to the client; on a re-run (attempt > 0) the LLM continues
    after them, so the client sees neither a repeated nor a missing token."""


INLINE_MEDIA_MAX_BYTES = 512 * 1024
"""A request whose media total at most this many bytes carries them in its first encode job as well as under
their keys: the encode worker then reads them from the job, not in a second Redis round trip after it (the
coordinator stores them meanwhile, for a re-run). Larger media (video, long audio) travel by key alone, so a
micro-batch's stream entry stays small."""


class MediaRef(BaseModel):
    model_config = ConfigDict(ser_json_bytes="base64", val_json_bytes="base64")

    key: str
    """Redis key holding the media bytes (TTL'd): an encoded image; a video's frames packed by
    coordinator/protocol/frames.py; or audio as float32 little-endian mono PCM at the encoder's rate."""
    kind: Modality = "image"
    data: bytes | None = Field(None, repr=False)
    """The bytes under `key`, inline (base64 in JSON) on a request's first encode job when its media are small
    (INLINE_MEDIA_MAX_BYTES); None: read them from `key`."""
    tokens: int = Field(0, ge=0)
    """Placeholder tokens this item expands to in the prompt, as the coordinator counted them (0: not counted;
    the prompt's ids say it). A job sent before its prompt (EncodeJob.prompt_key) weighs its SM split by them."""


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
    prompt_key: str | None = None
    """Set when the job left before its prompt was built (coordinator/prompt_ahead.py): its prompt_token_ids are
    empty and its sampling provisional until the encode worker pops a PromptReady from this Redis list, before
    its embeddings leave. None: the job carries its prompt."""

    @property
    def modality(self) -> Modality:
        """The request's one modality (the coordinator refuses requests that mix them)."""
        return self.media[0].kind if self.media else "image"


class PromptReady(BaseModel):
    """The prompt of an encode job that left before it (EncodeJob.prompt_key), once the coordinator built it; or
    `refused`: the request was answered with an error meanwhile, so its embeddings go nowhere."""

    prompt_token_ids: list[int] = []
    sampling: SamplingParams | None = None
    built_at: float = 0.0
    """Coordinator wall-clock time (time.time()) the prompt was built: the job's "prompt_built" mark."""
    refused: str | None = None
    """Why the request ended before its prompt was ready (bad input, client gone); None: ready."""

    @model_validator(mode="after")
    def _ready_or_refused(self) -> "PromptReady":
        if self.refused is None and (not self.prompt_token_ids or self.sampling is None):
            raise ValueError("a PromptReady carries the prompt's ids and sampling, or says why it was refused")
        return self


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
    output_token_ids: list[int] = Field(min_length=1)
    """Tokens already produced (by the prefill worker) and already streamed."""
    kv: list[TensorDescriptor] = []
    """Reference engine: the exported KV cache, sent over our transport."""
    rope_delta: int = 0
    """M-RoPE models: position of a generated token = its index + rope_delta (computed at prefill from
    the media grids, which the decode worker never sees); 0 for plain RoPE."""
    kv_transfer_params: dict[str, Any] | None = None
    """vLLM engine: where the decode engine's KV connector (NixlConnector) pulls the prefill's KV cache from,
    as the prefill engine reported it (JSON); the cache itself never crosses our transport."""
    media: list[EncodedMedia] = []
    """vLLM engine: the prefill job's media metadata (grids), which vLLM needs for M-RoPE positions."""

    @model_validator(mode="after")
    def _one_kv_source(self) -> DecodeJob:
        if bool(self.kv) == (self.kv_transfer_params is not None):
            raise ValueError("a DecodeJob carries its KV cache either as tensors (kv) or as kv_transfer_params "
                             f"for vLLM's connector, exactly one; got {len(self.kv)} tensors and "
                             f"kv_transfer_params={self.kv_transfer_params!r}")
        if self.kv_transfer_params is not None and not self.kv_transfer_params:
            raise ValueError("kv_transfer_params is empty: the decode engine would not know where the KV cache is")
        return self


class AbortJob(BaseModel):
    kind: Literal["abort"] = "abort"
    request_id: str


Job = Annotated[Union[EncodeJob, EncodeBatch, PrefillJob, DecodeJob, AbortJob], Field(discriminator="kind")]
JOB_ADAPTER: TypeAdapter[Job] = TypeAdapter(Job)


class Holder(BaseModel):
    """The worker process that holds a request now: its id and the instance (one per process start), so a
    restarted worker of the same id is not mistaken for the one that died with the request."""

    model_config = ConfigDict(frozen=True)

    worker_id: str
    instance: str


class TokenEvent(BaseModel):
    """One entry on a request's token stream: new tokens, and on the last one why it ended."""

    request_id: str = ""
    """Which request (events of many requests share the coordinator's reply stream)."""
    attempt: int = 0
    """The job's attempt (_Job.attempt) that produced the event."""
    holder: Holder | None = None
    """Set on a hand-off event (no tokens): the request moved to this worker (encode -> prefill,
    prefill -> decode); the coordinator re-runs the request if that worker dies."""
    index: int = 0
    """How many of the request's output tokens come before this event's: the coordinator checks that each
    event continues exactly where the last one ended (a gap means events were lost, e.g. with Redis)."""
    token_ids: list[int] = []
    text: str = ""
    finish_reason: FinishReason | None = None
    error: str | None = None
    logits: list[str] = []
    """Debug: base64 float32 logits, one per token in token_ids (SamplingParams.return_logits)."""
    logprobs: PackedLogprobs | None = None
    """The log-probabilities of token_ids (SamplingParams.logprobs), one entry per token."""
    prompt_tokens: int | None = None
    timing: Timing | None = None
    worker_id: str = ""
    batch_size: int = 0
    """Sequences in the engine step that produced these tokens (observability; tests of batching)."""

    @model_validator(mode="after")
    def _logprobs_match_tokens(self) -> TokenEvent:
        if self.logprobs is not None and self.logprobs.count != len(self.token_ids):
            raise ValueError(f"logprobs describe {self.logprobs.count} tokens, the event has {len(self.token_ids)}")
        return self

    def token_logprobs(self) -> list[TokenLogprobs]:
        """The log-probabilities of this event's tokens ([] when the request did not ask for them)."""
        return self.logprobs.unpack(self.token_ids) if self.logprobs is not None else []


def new_instance() -> str:
    """A fresh id for one process start of a worker (WorkerInfo.instance)."""
    return uuid.uuid4().hex[:12]


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
    job_address: str = ""
    """host:port of an encode worker's job link (encode_node/job_inbox.py), where the coordinator writes the
    micro-batches it would append to the worker's job stream; "" when it has none."""
    colocated_with: str | None = None
    """For a prefill worker on an encode GPU: that encode worker's id (its "local" prefill worker)."""
    device: str = "cpu"
    """Where its model runs (cpu or cuda:N) and in which dtype, e.g. "cuda:0 bfloat16"."""
    gpu_telemetry: str = ""
    """"nvml: <GPU name>" when its heartbeat stats carry NVML readings (gpu_*), else "unsupported: <why>"."""
    started_at: float
    instance: str = Field(default_factory=new_instance)
    """Unique per process start (a restarted worker keeps its id and gets a new instance)."""

    @property
    def holder(self) -> Holder:
        return Holder(worker_id=self.worker_id, instance=self.instance)
