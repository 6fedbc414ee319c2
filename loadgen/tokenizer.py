"""Prompts of an exact token count under a real tokenizer loaded from local files (never from a network).

A profile's ``tokenizer`` names a ``tokenizer.json`` or a Hugging Face tokenizer directory (``tokenizer.json``
plus ``tokenizer_config.json``, whose ``chat_template`` renders chat requests as the server does). The sim
writes one that counts exactly as it does: ``loadlens serve --model-profile tiny --write-tokenizer DIR``.
Without a tokenizer, prompts are words that are one token each in the sim and in common BPE vocabularies
(``loadgen/prompts.py``), and nothing is counted.

Usage::

    tok = load_tokenizer(Path("tok"))          # TokenizerError if it cannot be loaded
    tok.count("the of and")                    # 3
    tok.total("the of and", "chat")            # 12: the sim's chat template adds 9 around one user message

Texts of an exact count are built in ``loadgen/synthesis.py``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

PROBE = "the of and to in is it you"

Endpoint = Literal["chat", "completions"]


class TokenizerError(ValueError):
    """The tokenizer files cannot be used. The message names the file and the reason."""


def _special(config: dict[str, Any], key: str) -> str:
    value = config.get(key)
    if isinstance(value, dict):  # older configs: {"content": "<s>", "lstrip": false, ...}
        value = value.get("content")
    return value if isinstance(value, str) else ""


def _chat_template_source(directory: Path, config: dict[str, Any]) -> str | None:
    """A directory's chat template: ``chat_template.jinja``, ``chat_template.json`` or tokenizer_config.json."""
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    raw: Any = config.get("chat_template")
    doc = directory / "chat_template.json"
    if raw is None and doc.is_file():
        raw = json.loads(doc.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(raw, list):  # named templates: use the default one
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        raw = named.get("default")
    return raw if isinstance(raw, str) else None


def _compile_template(source: str, where: Path) -> Any:
    try:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError:
        raise TokenizerError(f"{where}: rendering its chat template needs jinja2 (pip install jinja2)") from None

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    # The settings Hugging Face renders chat templates with; templates are written against them.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent, ensure_ascii=False)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except TemplateError as err:
        raise TokenizerError(f"{where}: chat template does not compile: {err}") from None


@dataclass(eq=False)
class Tokenizer:
    """A loaded tokenizer: counts tokens and renders chat prompts as the server would."""

    path: Path
    """What the profile named (a file or a directory)."""
    file: Path
    """The ``tokenizer.json`` read."""
    sha256: str
    """Of ``tokenizer.json``."""
    backend: Any
    """``tokenizers.Tokenizer``."""
    template: Any = None
    """The compiled chat template, or None (then chat prompts are counted by their content only)."""
    bos_token: str = ""
    eos_token: str = ""
    _overhead: dict[str, int] = field(default_factory=dict)
    _words: dict[tuple[str, ...], tuple[str, ...]] = field(default_factory=dict)

    @property
    def has_chat_template(self) -> bool:
        return self.template is not None

    def count(self, text: str, *, special: bool = False) -> int:
        """Tokens of ``text``; ``special`` adds what the tokenizer's post-processor adds (a BOS)."""
        return len(self.backend.encode(text, add_special_tokens=special).ids)

    def render_chat(self, messages: Sequence[dict[str, Any]]) -> str:
        """The chat prompt text with the generation prompt (what vLLM tokenizes for chat completions)."""
        return str(
            self.template.render(
                messages=list(messages), add_generation_prompt=True, bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        )  # fmt: skip

    def total(self, text: str, endpoint: Endpoint) -> int:
        """Prompt tokens the server counts for a request whose only text is ``text``: chat renders it as one
        user message (the content alone without a template); completions adds the special tokens."""
        if endpoint == "chat":
            if self.template is None:
                return self.count(text)
            return self.count(self.render_chat([{"role": "user", "content": text}]))
        return self.count(text, special=True)

    def one_token_words(self, candidates: Sequence[str]) -> tuple[str, ...]:
        """The candidates that are one token alone and after a space (computed once per candidate list)."""
        key = tuple(candidates)
        if key not in self._words:
            self._words[key] = tuple(w for w in key if self.count(w) == 1 and self.count(" " + w) == 1)
        return self._words[key]

    def overhead(self, endpoint: Endpoint) -> int:
        """Tokens a request adds around its text (chat template, BOS), measured once per endpoint."""
        if endpoint not in self._overhead:
            self._overhead[endpoint] = self.total(PROBE, endpoint) - self.count(PROBE)
        return self._overhead[endpoint]


def load_tokenizer(path: Path) -> Tokenizer:
    """A ``tokenizer.json`` file or a directory holding one (and ``tokenizer_config.json``). Loaded once per
    process and file version. Raises :class:`TokenizerError`."""
    try:
        st = path.stat()
    except OSError as err:
        raise TokenizerError(f"{path}: {err.strerror}") from None
    return _load(path, st.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _backend(file: Path, mtime_ns: int) -> tuple[Any, str]:
    """``tokenizers.Tokenizer`` of ``file`` and the file's sha256, once per process and file version."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # Locust forks workers; one encode never needs it
    try:
        import tokenizers
    except ImportError:
        raise TokenizerError(f"{file}: a tokenizer needs the 'tokenizers' package (pip install tokenizers)") from None
    try:
        raw = file.read_bytes()
    except OSError as err:
        raise TokenizerError(f"{file}: cannot read: {err.strerror}") from None
    try:
        backend = tokenizers.Tokenizer.from_str(raw.decode("utf-8"))
    except Exception as err:  # tokenizers raises a bare Exception on a bad document
        raise TokenizerError(f"{file}: not a tokenizer.json the 'tokenizers' package can load: {err}") from None
    return backend, hashlib.sha256(raw).hexdigest()


@functools.lru_cache(maxsize=4)
def _load(path: Path, mtime_ns: int) -> Tokenizer:
    directory = path if path.is_dir() else path.parent
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise TokenizerError(f"{path}: no tokenizer.json (only the 'tokenizers' JSON format is read)")
    backend, sha256 = _backend(file, file.stat().st_mtime_ns)
    config: dict[str, Any] = {}
    config_file = directory / "tokenizer_config.json"
    if path.is_dir() and config_file.is_file():
        try:
            loaded = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise TokenizerError(f"{config_file}: not valid JSON: {err}") from None
        config = loaded if isinstance(loaded, dict) else {}
    source = _chat_template_source(directory, config) if path.is_dir() else None
    template = _compile_template(source, directory) if source else None
    tok = Tokenizer(
        path=path,
        file=file,
        sha256=sha256,
        backend=backend,
        template=template,
        bos_token=_special(config, "bos_token"),
        eos_token=_special(config, "eos_token"),
    )
    if template is not None:
        try:
            tok.overhead("chat")
        except Exception as err:  # a template that renders nothing sensible for one user message
            raise TokenizerError(f"{directory}: chat template fails for one user message: {err}") from None
    return tok
