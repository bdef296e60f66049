"""Deployment variants of an LLM worker (OServe's term): its weight dtype and its tensor-parallel degree.

A variant changes three things the planner cares about, each modelled here from a published source:
- memory: weights take bytes_per_weight x params / tp per GPU (bf16 2 B; fp8 and int8 weight-only 1 B; the
  per-channel scales are under 0.1 % and ignored); the KV cache stays bf16 (vLLM's default
  kv_cache_dtype=auto) and its heads are split over the tp GPUs (replicated when tp > kv_heads);
- speed: a forward reads 1/tp of the weights and does 1/tp of the FLOPs on each GPU (Megatron-LM's
  column/row split, Shoeybi et al. 2019), plus two all-reduces of the hidden states per layer
  (attention out, MLP out) over NVLink when the tier has it, else PCIe; a ring all-reduce moves
  2 (tp - 1) / tp of the message per GPU, plus 2 (tp - 1) link latencies;
- compute rate: fp8 runs W8A8 on FP8 tensor cores where the tier has them (Ada, Hopper: the catalog's
  peak_fp8_tflops, 2x BF16 dense), else weight-only through Marlin kernels (vLLM's fp8 docs: Ampere runs
  FP8 as W8A16) at the BF16 rate; int8 is weight-only (W8A16: GPTQ/AWQ-style int8 through Marlin), so it
  halves the bytes and keeps the BF16 FLOP rate.
Quality is not modelled: fp8 and int8 change the model's outputs, so plans use them only when asked.

A worker of a variant is named by a service key, "A100-80GB" for bf16 TP 1 (every plan before variants)
and "A100-80GB[int8/tp2]" otherwise: the simulator and ServiceTimes take the key where they took a tier.
What the engine here can run live (llm_node's reference engine: bf16, one GPU per worker) is
`runs_live`; anything else is simulated only.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Dtype = Literal["bf16", "fp8", "int8"]
DTYPES: tuple[Dtype, ...] = ("bf16", "fp8", "int8")
TP_DEGREES = (1, 2, 4)
BYTES_PER_WEIGHT: dict[str, float] = {"bf16": 2.0, "fp8": 1.0, "int8": 1.0}
"""Bytes per LLM weight by dtype."""


class Variant(BaseModel):
    """How one LLM worker holds and runs the model: weight dtype and tensor-parallel degree."""

    model_config = ConfigDict(frozen=True)

    dtype: Dtype = "bf16"
    """Weight dtype: bf16, fp8 (W8A8 on FP8 tensor cores, else weight-only) or int8 (weight-only)."""
    tp: int = 1
    """GPUs one worker spans (tensor parallel): 1, 2 or 4."""

    @field_validator("tp")
    @classmethod
    def _known_tp(cls, tp: int) -> int:
        if tp not in TP_DEGREES:
            raise ValueError(f"tensor-parallel degree must be one of {TP_DEGREES}, got {tp}")
        return tp

    @property
    def is_default(self) -> bool:
        return self.dtype == "bf16" and self.tp == 1

    def suffix(self) -> str:
        """"" for bf16 TP 1, else "[int8/tp2]" (what labels and service keys append; no comma, as labels
        are comma lists)."""
        return "" if self.is_default else f"[{self.dtype}/tp{self.tp}]"

    def runs_live(self) -> str | None:
        """None when llm_node's engine can run this variant; else why the plan is simulated only."""
        why = []
        if self.dtype != "bf16":
            why.append(f"{self.dtype} weights (the reference engine loads bf16/fp32 only)")
        if self.tp > 1:
            why.append(f"tensor parallel {self.tp} (the reference engine runs one GPU per worker)")
        return "; ".join(why) or None


DEFAULT = Variant()
_KEY = re.compile(r"^(?P<tier>[^\[\]]+?)(?:\[(?P<dtype>[a-z0-9]+)/tp(?P<tp>\d+)\])?$")


def service_key(tier: str, variant: Variant) -> str:
    """The name a worker of `variant` on `tier` is timed under (see the module docstring)."""
    return tier + variant.suffix()


def split_key(key: str) -> tuple[str, Variant]:
    """("A100-80GB", Variant(int8, 2)) from "A100-80GB[int8/tp2]"; a plain tier name is bf16 TP 1."""
    m = _KEY.match(key)
    if m is None or (m["dtype"] is not None and m["dtype"] not in DTYPES):
        raise ValueError(f"cannot read worker {key!r}; write TIER or TIER[DTYPE/tpN] with DTYPE one of "
                         f"{', '.join(DTYPES)} and N one of {TP_DEGREES}, e.g. A100[int8/tp2]")
    if m["dtype"] is None:
        return m["tier"], DEFAULT
    return m["tier"], Variant(dtype=m["dtype"], tp=int(m["tp"]))


class VariantSpace(BaseModel):
    """Which variants the search may give LLM workers (`tierserve plan --dtypes --tp`)."""

    model_config = ConfigDict(frozen=True)

    dtypes: tuple[Dtype, ...] = ("bf16",)
    """Weight dtypes to consider; bf16 only by default (fp8 and int8 change outputs: opt in)."""
    tp: tuple[int, ...] = TP_DEGREES
    """Tensor-parallel degrees to consider (lossless, so all by default)."""
    max_per_allocation: int = Field(64, ge=1)
    """Most variant assignments tried per allocation (bounds the enumeration on large inventories)."""

    @field_validator("tp")
    @classmethod
    def _known(cls, tp: tuple[int, ...]) -> tuple[int, ...]:
        bad = [t for t in tp if t not in TP_DEGREES]
        if bad or not tp:
            raise ValueError(f"tensor-parallel degrees must be some of {TP_DEGREES}, got {tp}")
        return tuple(sorted(set(tp)))

    @field_validator("dtypes")
    @classmethod
    def _some(cls, dtypes: tuple[str, ...]) -> tuple[str, ...]:
        if not dtypes:
            raise ValueError(f"give at least one dtype of {DTYPES}")
        return tuple(dict.fromkeys(dtypes))
