"""The approximate tokenizer and the pseudo-word vocabulary."""

from __future__ import annotations

import pytest

from exporters.serving.engines.sim.tokenizer import VOCAB_WORDS, count_tokens, encode, make_words, stable_seed


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("", 0),
        ("hello", 2),  # five characters: two pieces of up to four
        ("the cat sat", 3),  # "the", " cat", " sat"
        ("internationalisation", 5),
        ("12345", 2),  # digit groups of up to three
        ("Hi, you!", 4),  # "Hi", ",", " you", "!"
        ("a  b", 3),  # "a", "  " (whitespace run), "b"
    ],
)
def test_counts(text: str, tokens: int) -> None:
    assert count_tokens(text) == tokens
    assert len(encode(text)) == tokens


def test_english_prose_is_about_four_characters_per_token() -> None:
    prose = (
        "Observability for inference servers means measuring what users feel: the time to the first token, "
        "the gaps between tokens, and how both change as concurrency rises and the cache fills up."
    )
    ratio = len(prose) / count_tokens(prose)
    assert 3.0 < ratio < 5.0


def test_ids_are_stable_and_in_vocab() -> None:
    ids = encode("same text here", 1000)
    assert ids == encode("same text here", 1000)
    assert all(0 <= i < 1000 for i in ids)
    assert encode("same text here", 1000) != encode("other text here", 1000)


def test_pseudo_words_are_one_token_each_and_seeded() -> None:
    words = make_words(1)
    assert len(words) == VOCAB_WORDS
    assert all(count_tokens(w) == 1 and count_tokens(" " + w) == 1 for w in words)
    assert words == make_words(1) and words != make_words(2)
    text = "".join([words[0]] + [" " + w for w in words[1:50]])
    assert count_tokens(text) == 50


def test_stable_seed_does_not_depend_on_hash_randomisation() -> None:
    assert stable_seed(0, "prompt", "abc") == stable_seed(0, "prompt", "abc")
    assert stable_seed(0, "prompt", "abc") != stable_seed(1, "prompt", "abc")
    assert stable_seed("x") == 13_967_630_810_884_276_548  # frozen: changing it changes every seeded run
