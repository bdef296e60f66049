"""A real local cluster (separate processes on a real Redis) shared by the integration tests."""

from __future__ import annotations

import pytest

from cluster_factory import serve_cluster

MAX_IMAGE_BYTES = 300_000


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory):
    """The one directory the shared cluster lets image_url name local files under."""
    return tmp_path_factory.mktemp("media")


@pytest.fixture(scope="session")
def cluster(redis_url, tmp_path_factory, media_dir):
    """One encode worker with a co-located prefill worker (llm-local-0); a combined worker and a
    prefill -> decode pair, so every LLM path is live. Its image requests take the prompt-ahead path
    (coordinator/prompt_ahead.py), so the tests on it check that path too; the other clusters build first."""
    yield from serve_cluster(
        tmp_path_factory.mktemp("cluster-logs"), encode_workers=1, llm_roles=["combined", "prefill", "decode"],
        local_prefill=True, steal=True, redis_url=redis_url,
        coordinator_args=["--max-image-bytes", str(MAX_IMAGE_BYTES), "--allowed-local-media-dir", str(media_dir),
                          "--prompt-ahead"])


@pytest.fixture(scope="session")
def tiny_model():
    import torch
    import transformers
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    from coordinator.protocol.models import DEFAULT_MODEL_DIR

    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(2)
    return (LlavaForConditionalGeneration.from_pretrained(DEFAULT_MODEL_DIR).eval(),
            AutoProcessor.from_pretrained(DEFAULT_MODEL_DIR))


@pytest.fixture(scope="session")
def max_image_bytes() -> int:
    """The coordinator's --max-image-bytes in the shared cluster."""
    return MAX_IMAGE_BYTES
