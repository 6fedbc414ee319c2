"""The approximate tokenizer and the pseudo-word vocabulary."""

from __future__ import annotations

import zlib

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


def test_encode_cache_is_bounded_by_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from exporters.serving.engines.sim import tokenizer

    cache = tokenizer._EncodeCache(max_bytes=40_000)
    monkeypatch.setattr(tokenizer, "_cache", cache)
    words = make_words(3)
    for i in range(200):
        text = f"{i}" + "".join(" " + w for w in words[:999])  # 1,000 tokens, 2 bytes each
        assert len(encode(text)) == 1000
        assert cache.bytes <= 40_000
    assert len(cache) == 40_000 // (2000 + tokenizer._ENTRY_OVERHEAD)
    assert cache.bytes == len(cache) * (2000 + tokenizer._ENTRY_OVERHEAD)
    # A hit returns the same ids as a fresh encode.
    last = "199" + "".join(" " + w for w in words[:999])
    assert encode(last) == tuple(tokenizer._encode(last, 32000))


def test_encode_cache_skips_entries_over_a_quarter_of_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    from exporters.serving.engines.sim import tokenizer

    cache = tokenizer._EncodeCache(max_bytes=4_000)
    monkeypatch.setattr(tokenizer, "_cache", cache)
    assert len(encode("word " * 600)) == 1200
    assert len(cache) == 0


def test_ids_depend_on_vocab_and_large_vocabularies_fit() -> None:
    assert encode("same text", 1000) != encode("same text", 999)
    ids = encode("the cat sat", 200_000)
    assert all(0 <= i < 200_000 for i in ids)
    assert ids == tuple(zlib.crc32(p.encode()) % 200_000 for p in ("the", " cat", " sat"))
    assert len(ids) == 3


def test_lone_surrogates_are_counted_not_raised() -> None:
    assert len(encode("a\ud800b")) == count_tokens("a\ud800b") == 3
