"""Placeholders are expanded in ids, not in text: the ids must be those of the expanded text, for every model."""

from __future__ import annotations

import re

import pytest

from coordinator.prompt import PromptBuilder

ASSETS = {"llava": "coordinator/assets/tiny-llava", "qwen2-vl": "coordinator/assets/tiny-qwen2-vl",
          "qwen2-audio": "coordinator/assets/tiny-qwen2-audio"}
TEXTS = ["{p}Describe this.", "a{p}b", "{p}{p} two in a row", " lead {p}\n\ntrail ", "über {p}日本語 {p}!",
         "{p}", "x" * 300 + "{p}" + " y" * 50]


@pytest.fixture(scope="module", params=sorted(ASSETS))
def builder(request) -> PromptBuilder:
    return PromptBuilder.from_model_dir(ASSETS[request.param])


def _expanded_ids(b: PromptBuilder, text: str, counts: list[int]) -> list[int]:
    pieces = re.split(f"({'|'.join(map(re.escape, b.view.placeholders.values()))})", text)
    expanded = pieces[0] + "".join(tok * n + after for tok, n, after in zip(pieces[1::2], counts, pieces[2::2]))
    return b.tokenizer(expanded)["input_ids"]


@pytest.mark.parametrize("template", TEXTS)
def test_ids_are_the_expanded_texts(builder, template):
    placeholder = next(iter(builder.view.placeholders.values()))
    text = template.format(p=placeholder)
    pieces = re.split(f"({re.escape(placeholder)})", text)
    counts = [7 + 5 * i for i in range(len(pieces) // 2)]
    assert builder._added, "every shipped model's placeholder is one added token: the fast path is taken"
    ids = builder._tokenize(text, pieces, [(placeholder, n) for n in counts])
    assert ids == _expanded_ids(builder, text, counts)
    assert ids.count(builder._added[placeholder]) == sum(counts)


def test_without_an_added_placeholder_token_the_expanded_text_is_tokenized(builder):
    placeholder = next(iter(builder.view.placeholders.values()))
    text = f"a{placeholder}b"
    pieces = re.split(f"({re.escape(placeholder)})", text)
    builder_added, builder._added = builder._added, {}
    try:
        assert builder._tokenize(text, pieces, [(placeholder, 3)]) == _expanded_ids(builder, text, [3])
    finally:
        builder._added = builder_added


def test_a_count_that_disagrees_with_the_text_takes_the_expanded_path(builder):
    """More runs than the text spells (never from build(), which checks it): no id is dropped or invented."""
    placeholder = next(iter(builder.view.placeholders.values()))
    text = f"a{placeholder}b"
    pieces = re.split(f"({re.escape(placeholder)})", text)
    assert builder._tokenize(text, pieces, [(placeholder, 3), (placeholder, 4)]) == _expanded_ids(builder, text, [3])
