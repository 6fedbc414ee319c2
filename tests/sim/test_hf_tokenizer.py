"""The Hugging Face tokenizer written for sim profiles counts exactly as the sim tokenizer, offline."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

from exporters.serving.engines.sim import load_model_profile
from exporters.serving.engines.sim.hf_tokenizer import UNKNOWN, write_tokenizer
from exporters.serving.engines.sim.tokenizer import count_tokens, make_words
from exporters.serving.protocol import parse_request
from tests.support import required

tokenizers = required.require_module("tokenizers")

VARIED = [
    "",
    "hello",
    "the cat sat",
    "internationalisation",
    "12345 67 8",
    "Hi, you!  What's up?!?",
    "a  b\t\tc\n\n\nd    e",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit. Sed do eiusmod tempor.",
    "naïve café, Ærøskøbing; Straße — «quotes» …",
    "你好世界，这是一个测试。日本語のテキスト、カタカナ。",
    "😀🎉 emoji 👍🏽 and ZWJ 👨‍👩‍👧",
    "½ x² ١٢٣ ٤٥ ๑๒๓ Ⅻ ⅷ",
    "__init__ snake_case_name __dunder__ _",
    "a\u0301b e\u0308 combining marks\u0327",
    "\x1c\x1d\x1e\x1f \x85\xa0\u2003\u3000 odd spaces",
    "def f(x):\n    return x**2 + 1  # comment\n",
    'JSON {"k": [1, 2.5, -3e10], "s": "v\\n"}',
    "ALL CAPS SHOUTING AND MiXeD CaSe",
    "https://example.com/path?q=1&r=two#frag",
    "\u0000\u0007 control \u200b\u200d zero-width",
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("tiny-tokenizer")
    written = write_tokenizer(directory, load_model_profile("tiny"))
    assert sorted(p.name for p in written) == ["tokenizer.json", "tokenizer_config.json"]
    return directory


@pytest.fixture(scope="module")
def fast(tokenizer_dir: Path) -> Any:
    return tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))


def test_counts_equal_the_sim_on_varied_text(fast: Any) -> None:
    counts = [len(e.ids) for e in fast.encode_batch(VARIED)]
    assert counts == [count_tokens(t) for t in VARIED]


def test_counts_equal_the_sim_on_random_unicode(fast: Any) -> None:
    rng = random.Random(13)
    pool = [chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF]
    texts = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 40))) for _ in range(2000)]
    # Mostly-ASCII mixes too, where the classes meet (letters next to digits, spaces next to punctuation).
    ascii_pool = list(" \t\n_.,!?'-0123456789abcXYZ") + pool[:0x3000:7]
    texts += ["".join(rng.choice(ascii_pool) for _ in range(rng.randint(1, 60))) for _ in range(2000)]
    counts = [len(e.ids) for e in fast.encode_batch(texts)]
    assert counts == [count_tokens(t) for t in texts]


def test_every_code_point_is_classified_as_the_sim_does(fast: Any) -> None:
    # Around each character, neighbours of every class: the count changes with the class it is put in.
    probes = [f"x{c}x 1{c}1 .{c}. _{c}_ \n{c}\n" for c in map(chr, range(0x30000)) if not 0xD800 <= ord(c) <= 0xDFFF]
    counts = [len(e.ids) for e in fast.encode_batch(probes)]
    expected = [count_tokens(p) for p in probes]
    wrong = [probes[i][1] for i, (a, b) in enumerate(zip(counts, expected, strict=True)) if a != b]
    assert wrong == []


def test_decode_gives_english_back_and_prefixes_keep_their_count(fast: Any) -> None:
    text = VARIED[7] + " " + " ".join(make_words(1)[:200])
    ids = fast.encode(text).ids
    assert fast.decode(ids) == text
    for n in (1, 7, 50, len(ids) - 1):
        assert count_tokens(fast.decode(ids[:n])) == n


def test_unknown_chunks_decode_to_a_one_token_stand_in(fast: Any) -> None:
    ids = fast.encode("ABCD").ids
    assert fast.decode(ids) == UNKNOWN
    assert count_tokens(UNKNOWN) == 1


def test_transformers_loads_it_offline_with_chat_template(
    tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    transformers = required.require_module("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert "regex" not in capsys.readouterr().err  # no Mistral-regex warning
    assert tok.model_max_length == load_model_profile("tiny").max_model_len
    for text in VARIED:
        assert len(tok.encode(text)) == count_tokens(text), text
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "three"},
    ]
    rendered = tok.apply_chat_template(messages, tokenize=False)
    parsed = parse_request("chat", {"messages": messages})
    assert rendered == parsed.prompt
    assert len(tok.apply_chat_template(messages, tokenize=True)["input_ids"]) == count_tokens(parsed.prompt)


def test_cli_writes_the_tokenizer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from loadlens.cli import main

    assert main(["serve", "--model-profile", "tiny", "--write-tokenizer", str(tmp_path / "tok")]) == 0
    out = capsys.readouterr().out.split()
    assert out == [str(tmp_path / "tok" / n) for n in ("tokenizer.json", "tokenizer_config.json")]
