"""A huge text is refused before it is tokenized, and a long tokenization does not hold up other requests.

Measured on a 2-core machine: the tiny LLaVA's tokenizer takes ~2.3 s a million characters, so the
45 MB body below would take ~100 s to tokenize; refusing it takes milliseconds.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest
from transformers import AutoProcessor

from coordinator.api.schema import ChatCompletionRequest
from coordinator.errors import RequestError
from coordinator.prompt import DEFAULT_MAX_PROMPT_CHARS, PromptBuilder
from coordinator.protocol.models import DEFAULT_MODEL_DIR
from coordinator.tokenizer_pool import TokenizerPool


@pytest.fixture(scope="module")
def processor():
    return AutoProcessor.from_pretrained(DEFAULT_MODEL_DIR)


def request(*texts: str, role: str = "user") -> ChatCompletionRequest:
    messages = [{"role": role, "content": t} for t in texts[:-1]] + [{"role": "user", "content": texts[-1]}]
    return ChatCompletionRequest.model_validate({"model": "tiny-llava", "messages": messages})


def size_error(builder: PromptBuilder, req: ChatCompletionRequest) -> RequestError:
    with pytest.raises(RequestError) as e:
        builder.build(req)
    return e.value


def test_a_45_mb_text_is_refused_before_tokenizing(processor):
    builder = PromptBuilder(processor)
    req = request("x" * 45_000_000)
    t0 = time.perf_counter()
    err = size_error(builder, req)
    seconds = time.perf_counter() - t0
    assert err.status == 413 and err.param == "messages"
    assert f"45,000,000 characters of text; the limit is {DEFAULT_MAX_PROMPT_CHARS:,} (--max-prompt-chars)" \
        in err.message and "shorten the messages" in err.message
    assert seconds < 1.0, f"refusing took {seconds:.2f} s; tokenizing 45 MB takes ~100 s"
    assert builder.tokenizers.copies == 0  # no tokenizer was even lent


def test_text_is_counted_over_every_message_and_part(processor):
    builder = PromptBuilder(processor, max_prompt_chars=1000)
    assert builder.build(request("a" * 500, "b" * 499, role="system")).prompt_token_ids
    assert size_error(builder, request("a" * 500, "b" * 501, role="system")).status == 413
    parts = [{"type": "text", "text": "c" * 600}, {"type": "text", "text": "d" * 600}]
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": parts}]})
    assert "1,200 characters" in size_error(builder, req).message


def test_a_prompt_under_the_cap_still_meets_the_context_check(processor):
    err = size_error(PromptBuilder(processor, max_prompt_chars=100_000), request("word " * 10_000))
    assert err.status == 400 and "the model's context is 2048 tokens" in err.message


LONG = ("The quick brown fox jumps over the lazy dog. " * 23_000)[:1_000_000]
"""~2.3 s to tokenize (holding one tokenizer that long); a short request takes milliseconds."""


def test_a_long_tokenization_does_not_hold_up_a_short_request(processor):
    builder = PromptBuilder(processor)
    done = threading.Event()

    def long_request():
        with contextlib.suppress(RequestError):  # over the context: refused once tokenized
            builder.build(request(LONG))
        done.set()

    worker = threading.Thread(target=long_request)
    worker.start()
    deadline = time.monotonic() + 10
    while builder.tokenizers.copies == 0 and time.monotonic() < deadline:  # the long one holds a tokenizer
        time.sleep(0.001)
    t0 = time.perf_counter()
    built = builder.build(request("hi there"))
    seconds = time.perf_counter() - t0
    overlapped = not done.is_set()
    worker.join()
    assert built.prompt_token_ids and seconds < 0.5, f"the short request waited {seconds:.2f} s"
    assert overlapped, "the long request finished first, so this proves nothing; make it longer"
    assert builder.tokenizers.copies == 2


def test_the_pool_lends_each_copy_to_one_thread(processor):
    tokenizer = processor.tokenizer
    pool = TokenizerPool(tokenizer, size=2)
    got = threading.Event()
    with pool.borrow() as a, pool.borrow() as b:
        assert a is not b and tokenizer not in (a, b)

        def third():
            with pool.borrow() as c:
                assert c in (a, b)
                got.set()

        waiter = threading.Thread(target=third)
        waiter.start()
        assert not got.wait(0.2)  # both copies are out: the third borrower waits
    assert got.wait(5)
    waiter.join()
    assert pool.copies == 2
    with pytest.raises(ValueError):
        TokenizerPool(tokenizer, size=0)
