"""A Hugging Face tokenizer that counts tokens exactly as the sim does, for third-party clients offline.

Clients such as guidellm need a tokenizer for the served model (to build synthetic prompts of N tokens) and
would download the real model's. :func:`write_tokenizer` writes one for a sim model profile into a directory
that ``transformers.AutoTokenizer.from_pretrained(dir)`` and ``tokenizers.Tokenizer.from_file(dir /
"tokenizer.json")`` load without a network:

- ``tokenizer.json``: two ``Split`` pre-tokenizers and a ``WordLevel`` model. The first split is the sim's
  :data:`~exporters.serving.engines.sim.tokenizer.PIECE_PATTERN` with each character class written out as the
  explicit code point ranges Python's ``re`` gives it (enumerated from
  :data:`~exporters.serving.engines.sim.tokenizer.PIECE_CLASSES` when the file is written), so the Oniguruma
  regex inside ``tokenizers`` splits exactly as the sim does, whatever Unicode tables either library has.
  The second cuts each piece into :data:`~exporters.serving.engines.sim.tokenizer.PIECE_CHARS`-character
  tokens. Every token becomes exactly one id, known or not, so **counts equal the sim's for any text**.
- The vocabulary makes ``decode`` give the text back for the chunks English text is made of: every ASCII
  letter chunk in lower case or capitalised (with or without a leading space), digit groups, ASCII
  punctuation pairs, short whitespace runs, and every single character of the Basic Multilingual Plane
  (about a million entries, 14 MB). Other chunks (``ABCD``, four CJK characters) decode to the stand-in
  `` unk``, which the sim also counts as one token, so ``decode(encode(text)[:n])`` re-tokenizes to ``n``
  tokens (off by one only when the stand-in follows a whitespace run of a multiple of four characters).
- ``tokenizer_config.json``: ``PreTrainedTokenizerFast``, ``model_max_length`` from the profile, no special
  tokens (the sim adds none), and a chat template that renders messages as the sim does
  (``<|role|>content`` lines, then ``<|assistant|>``), so chat prompt counts match too.
No ``config.json``: without one, transformers 5 loads the directory as a plain local tokenizer (with one
lacking ``model_type``, it warns about Mistral's regex).

Run: ``loadlens serve --model-profile NAME --write-tokenizer DIR``. Ids are not the sim's ids (those are
CRC-32 hashes used for prefix caching); only counts and text are shared.
"""

from __future__ import annotations

import itertools
import json
import re
import string
import sys
from pathlib import Path
from typing import Any

from exporters.serving.engines.sim.tokenizer import PIECE_CHARS, PIECE_CLASSES, PIECE_TEMPLATE
from loadlens.contracts.model_profile import ModelProfile

UNKNOWN = " unk"
"""What an out-of-vocabulary chunk decodes to: one 4-character letter token, so a decoded prompt keeps its count."""
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if not loop.first %}{{ '\\n' }}{% endif %}<|{{ message['role'] }}|>"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] is not none %}"
    "{{ message['content'] | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\\n') }}"
    "{% endif %}{% endfor %}{{ '\\n<|assistant|>' }}"
)
"""The sim's own prompt rendering (``exporters.serving.protocol``): ``<|role|>content`` joined by newlines."""


def _code_points() -> str:
    return "".join(chr(c) for c in range(sys.maxunicode + 1) if not 0xD800 <= c <= 0xDFFF)


def _ranges(chars: str) -> list[tuple[int, int]]:
    points = sorted({ord(c) for c in chars})
    out: list[tuple[int, int]] = []
    for cp in points:
        if out and out[-1][1] == cp - 1:
            out[-1] = (out[-1][0], cp)
        else:
            out.append((cp, cp))
    return out


def _onig_class(ranges: list[tuple[int, int]]) -> str:
    body = "".join(f"\\x{{{lo:X}}}" if lo == hi else f"\\x{{{lo:X}}}-\\x{{{hi:X}}}" for lo, hi in ranges)
    return f"[{body}]"


def onig_piece_pattern() -> str:
    """The sim's piece pattern with every class as explicit code point ranges (Oniguruma syntax)."""
    every = _code_points()
    classes = {name: _onig_class(_ranges("".join(re.findall(f"{cls}+", every)))) for name, cls in PIECE_CLASSES.items()}
    return PIECE_TEMPLATE.format(**classes)


def _vocabulary() -> dict[str, int]:
    lower, upper = string.ascii_lowercase, string.ascii_uppercase
    chunks: dict[str, None] = {UNKNOWN: None}

    def add(items: Any) -> None:
        for item in items:
            chunks["".join(item) if not isinstance(item, str) else item] = None

    for n in range(1, PIECE_CHARS + 1):
        add(itertools.product(lower, repeat=n))
        add(itertools.product(upper, *[lower] * (n - 1)))
        if n < PIECE_CHARS:
            add(itertools.product(" ", lower, *[lower] * (n - 1)))
            add(itertools.product(" ", upper, *[lower] * (n - 1)))
    add(itertools.product(upper, repeat=2))
    add(itertools.product(" ", upper, upper))
    for n in range(1, 4):
        add(itertools.product(string.digits, repeat=n))
        add(itertools.product(" ", *[string.digits] * n))
    punct = string.punctuation.replace("_", "")
    add(punct)
    add(itertools.product(punct, repeat=2))
    add(itertools.product(" ", punct))
    add(itertools.product(" ", punct, punct))
    add("_" * n for n in range(1, PIECE_CHARS + 1))
    for n in range(1, PIECE_CHARS + 1):
        add(itertools.product(" \n\t", repeat=n))
    add(chr(c) for c in range(0x10000) if not 0xD800 <= c <= 0xDFFF)
    return {chunk: i for i, chunk in enumerate(chunks)}


def tokenizer_json() -> dict[str, Any]:
    """The ``tokenizer.json`` document (``tokenizers`` serialization format)."""
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": onig_piece_pattern()}, "behavior": "Isolated", "invert": False},
                {
                    "type": "Split",
                    "pattern": {"Regex": f"[\\s\\S]{{1,{PIECE_CHARS}}}"},
                    "behavior": "Isolated",
                    "invert": False,
                },
            ],
        },
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": _vocabulary(), "unk_token": UNKNOWN},
    }


def write_tokenizer(directory: Path, profile: ModelProfile, served_model_name: str | None = None) -> list[Path]:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for ``profile`` into ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    doc = tokenizer_json()
    name = served_model_name or profile.name
    files = {
        "tokenizer.json": doc,
        "tokenizer_config.json": {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": profile.max_model_len,
            "clean_up_tokenization_spaces": False,
            "add_bos_token": False,
            "add_eos_token": False,
            "chat_template": CHAT_TEMPLATE,
            "name_or_path": name,
        },
    }
    written = []
    for filename, content in files.items():
        path = directory / filename
        path.write_text(json.dumps(content, ensure_ascii=False, separators=(",", ":")), encoding="utf-8")
        written.append(path)
    return written
