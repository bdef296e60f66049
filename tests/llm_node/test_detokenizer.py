"""Incremental detokenization: deltas never split a character; stop strings cut the text."""

from __future__ import annotations

import pytest

from llm_node.detokenizer import IncrementalDetokenizer

PROMPT = "<|user|>\nsay something</s>\n<|assistant|>\n"


@pytest.fixture
def stream(tokenizer):
    """Push `text`'s tokens one at a time; returns (deltas, stopped flags, detokenizer)."""

    def run(text: str, stop: tuple[str, ...] = (), flush: bool = True):
        detok = IncrementalDetokenizer(tokenizer, tokenizer.encode(PROMPT, add_special_tokens=False), stop)
        deltas, stopped = [], []
        for token in tokenizer.encode(text, add_special_tokens=False):
            d = detok.push([token])
            deltas.append(d.text)
            stopped.append(d.stopped)
            if d.stopped:
                break
        if flush and not detok.stopped:
            deltas.append(detok.flush())
        return deltas, stopped, detok

    return run


def test_multibyte_characters_are_never_split(stream, tokenizer):
    text = "héllo 日本 🙂 the cat"
    assert len(tokenizer.encode(text, add_special_tokens=False)) > len(text.split())  # bytes span tokens
    deltas, _, _ = stream(text)
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
    assert "日本" in "".join(deltas) and any("🙂" in d for d in deltas)
    assert "" in deltas  # some pushes had to wait for the rest of a character


def test_incomplete_character_is_flushed_at_the_end(tokenizer):
    detok = IncrementalDetokenizer(tokenizer, [], ())
    first_byte_of_e_acute = tokenizer.encode("é", add_special_tokens=False)[0]
    assert detok.push([first_byte_of_e_acute]).text == ""
    assert detok.flush() == "\ufffd"


def test_stop_string_is_not_emitted_and_text_before_it_is(stream):
    deltas, stopped, detok = stream("the cat and the dog", stop=("and",))
    assert "".join(deltas) == "the cat "
    assert stopped[-1] and not any(stopped[:-1])
    assert detok.text == "the cat " and detok.flush() == ""


def test_stop_string_across_tokens_and_a_false_start(stream):
    # "cat a" starts like the stop string "cat and" but is not it; the held-back part comes out later.
    deltas, stopped, _ = stream("the cat a dog, the cat and more", stop=("cat and",))
    assert "".join(deltas) == "the cat a dog, the "
    assert stopped[-1]


def test_prefix_of_stop_string_is_held_back_until_resolved(stream):
    deltas, stopped, _ = stream("the cat", stop=("cat dog",), flush=False)
    assert "".join(deltas) == "the "  # "cat" might still become "cat dog"
    assert not any(stopped)


def test_held_back_text_is_flushed_when_the_request_ends(stream):
    deltas, _, _ = stream("the cat", stop=("cat dog",))
    assert "".join(deltas) == "the cat"


def test_replaying_tokens_reaches_the_same_state(tokenizer):
    """A decode worker replays the prefill worker's tokens and must continue the stream seamlessly."""
    ids = tokenizer.encode("héllo the cat and 日本 the dog", add_special_tokens=False)
    whole = IncrementalDetokenizer(tokenizer, [], ("dog",))
    deltas = [whole.push([t]).text for t in ids]
    for k in range(1, len(ids)):
        replayed = IncrementalDetokenizer(tokenizer, [], ("dog",))
        for t in ids[:k]:
            replayed.push([t])
        rest = [replayed.push([t]).text for t in ids[k:]]
        assert rest == deltas[k:], k
