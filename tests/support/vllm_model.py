"""A tiny Llama for a real vLLM on a CPU, made offline and never downloaded (docs/real-vllm.md).

``tiny_model()`` returns a directory with a random-weight ``LlamaForCausalLM`` (``TINY``: hidden 128, intermediate
256, 2 layers, 4 heads, 2 KV heads, bf16, a fixed seed), a WordPiece tokenizer built with ``tokenizers`` (1,547
tokens: vLLM refuses LoRA with a vocabulary over 258,048, which rules out the sim's ``--write-tokenizer`` one)
with a chat template, and PEFT LoRA adapters of the ranks asked for on ``q_proj``/``v_proj``. The directory's
name is a hash of everything that decides its content (this file's source, the shape, the ranks), so it is built
once per checkout and rebuilt whenever this file changes; a half-written build never takes its place.

``tiny_model(shape=CALIBRATION)`` is the calibration rig's model (docs/calibration.md, section 4): the same
tokenizer and template, 47.2M parameters (hidden 1024, intermediate 2816, 4 layers, 16 heads, 2 KV heads), no
adapters. On the 2-core machine its engine step (about 5 ms a decode) is long beside the API server's and the
client's work on the shared core, so vLLM streams its tokens as it makes them (1 or 2 requests of 20 in one
burst, ``benchmarks.vllm_bursts --shape calibration``); the tiny model's 1.5 ms steps reach the client in one
burst. Its LM head rows of the special tokens are zero: their logit is then 0 where
some other token's is almost surely above it, so greedy decoding never emits a run of special tokens, which
decode to no text (a stream without content is a failed request to the load generator).

It needs torch, transformers, peft and tokenizers (loadlens's ``training`` extra), so it runs in loadlens's
venv; vLLM's own environment only reads the files. Command line, for benchmarks and ``--server-command``s::

    python -m tests.support.vllm_model [--cache-dir DIR] [--ranks 2,8,32] [--shape tiny|calibration]
    # prints the model directory
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shutil
import string
import tempfile
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

from tests.support.paths import ROOT

CACHE_DIR = ROOT / ".cache" / "vllm-model"
SERVED_NAME = "tiny-llama"
RANKS: tuple[int, ...] = (2, 8, 32)
SEED = 1234
MAX_POSITIONS = 1024
SPECIAL = {"unk": "<unk>", "pad": "<pad>", "bos": "<s>", "eos": "</s>"}
ROLES = ("system", "user", "assistant", "tool", "developer")
END = "<|end|>"
# Each message as <|role|>\n text <|end|>\n; the content is read as one string, so vLLM sends a string
# (text parts joined) rather than a list of parts.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}"
    + END
    + "\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
DONE = ".complete"


@dataclass(frozen=True)
class Shape:
    """A Llama's shape; everything else (tokenizer, template, seed, dtype) is the same for every shape."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    quiet_special_tokens: bool = False
    """Zero the LM head's rows of the special tokens (see the module's docstring)."""


TINY = Shape("tiny", hidden=128, intermediate=256, layers=2, heads=4, kv_heads=2)
CALIBRATION = Shape("calibration", hidden=1024, intermediate=2816, layers=4, heads=16, kv_heads=2,
                    quiet_special_tokens=True)  # fmt: skip
SHAPES = {shape.name: shape for shape in (TINY, CALIBRATION)}


@dataclass(frozen=True)
class TinyModel:
    root: Path
    """The hashed directory: ``model/`` and ``adapters/<name>/``."""
    ranks: tuple[int, ...]

    @property
    def path(self) -> Path:
        """The base model directory: ``--model`` of vLLM."""
        return self.root / "model"

    @property
    def adapter_root(self) -> Path:
        """The parent of every adapter: the proxy's ``--lora-root``."""
        return self.root / "adapters"

    @property
    def adapters(self) -> dict[str, Path]:
        """Adapter name (``r<rank>``) -> its directory."""
        return {adapter_name(rank): self.adapter_root / adapter_name(rank) for rank in self.ranks}

    @property
    def vocab_size(self) -> int:
        return len(vocabulary())


def adapter_name(rank: int) -> str:
    return f"r{rank}"


def vocabulary() -> list[str]:
    """Special tokens, role markers, single characters and lowercase letter pairs, each also as a ``##``
    continuation: every ASCII word has a tokenization, at about one token per two letters."""
    chars = [c for c in string.printable if not c.isspace()]
    pairs = ["".join(p) for p in product(string.ascii_lowercase, repeat=2)]
    words = [*chars, *pairs]
    markers = [f"<|{role}|>" for role in ROLES] + [END]
    return [*SPECIAL.values(), *markers, *words, *(f"##{w}" for w in words)]


def content_key(ranks: Sequence[int], shape: Shape = TINY) -> str:
    """A hash of what decides the files: this module's source (the shapes, seed, vocabulary and template are
    all written here), the shape and the ranks."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps(sorted(set(ranks))).encode())
    digest.update(repr(shape).encode())
    return digest.hexdigest()[:16]


def tiny_model(cache_dir: Path | None = None, ranks: Sequence[int] = RANKS, shape: Shape = TINY) -> TinyModel:
    """The model of ``shape`` with adapters of ``ranks``, built under ``cache_dir`` unless it is there
    already."""
    ranks = tuple(sorted(set(ranks)))
    root = (cache_dir or CACHE_DIR) / content_key(ranks, shape)
    model = TinyModel(root, ranks)
    if (root / DONE).exists():
        return model
    root.parent.mkdir(parents=True, exist_ok=True)
    # Built beside its place and renamed into it: a build cut short leaves only a temporary directory.
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}-", dir=root.parent))
    try:
        _build(TinyModel(tmp, ranks), shape)
        (tmp / DONE).write_text("", encoding="utf-8")
        try:
            os.rename(tmp, root)
        except OSError:
            if not (root / DONE).exists():  # another builder did not win the race: a stale directory is in the way
                shutil.rmtree(root, ignore_errors=True)
                os.rename(tmp, root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return model


def rig_model(shape: str = TINY.name) -> TinyModel:
    """The model of the shape named, as the benchmarks serve it: the tiny one with its adapters, any other
    without (the calibration rig loads none)."""
    return tiny_model() if shape == TINY.name else tiny_model(ranks=(), shape=SHAPES[shape])


def _build(model: TinyModel, shape: Shape) -> None:
    import torch

    torch.manual_seed(SEED)
    # transformers and PEFT warn about their own deprecations while saving; under pytest warnings are errors.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tokenizer = _tokenizer()
        _write_tokenizer(tokenizer, model.path)
        llama = _llama(tokenizer, shape)
        llama.save_pretrained(model.path, safe_serialization=True)
        for rank in model.ranks:
            _write_adapter(llama, rank, model.adapters[adapter_name(rank)])


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {token: i for i, token in enumerate(vocabulary())}
    tok = Tokenizer(models.WordPiece(vocab, unk_token=SPECIAL["unk"], max_input_chars_per_word=100))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    # Special tokens are matched before pre-tokenization, so a role marker is one token, never split.
    tok.add_special_tokens([*SPECIAL.values(), *(f"<|{role}|>" for role in ROLES), END])
    return tok


def _write_tokenizer(tokenizer: Any, out: Path) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token=SPECIAL["unk"],
        pad_token=SPECIAL["pad"],
        bos_token=SPECIAL["bos"],
        eos_token=SPECIAL["eos"],
        model_max_length=MAX_POSITIONS,
        chat_template=CHAT_TEMPLATE,
    )
    fast.save_pretrained(out)


def _llama(tokenizer: Any, shape: Shape) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.token_to_id(SPECIAL["bos"]),
        eos_token_id=tokenizer.token_to_id(SPECIAL["eos"]),
        pad_token_id=tokenizer.token_to_id(SPECIAL["pad"]),
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    llama = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    if shape.quiet_special_tokens:
        special = [tokenizer.token_to_id(t) for t in [*SPECIAL.values(), *(f"<|{role}|>" for role in ROLES), END]]
        with torch.no_grad():
            llama.lm_head.weight[special] = 0
    return llama


def _write_adapter(llama: Any, rank: int, out: Path) -> None:
    import torch
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    peft_model = get_peft_model(copy.deepcopy(llama), config)  # the base model stays free of LoRA layers
    # PEFT starts B at zero (an adapter that changes nothing); random B makes each adapter's output its own.
    generator = torch.Generator().manual_seed(SEED + rank)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    # The served name, not a path: the files stay the same wherever the cache is.
    peft_model.peft_config["default"].base_model_name_or_path = SERVED_NAME
    peft_model.save_pretrained(str(out), safe_serialization=True)
    (out / "README.md").unlink(missing_ok=True)  # PEFT's model card template


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.support.vllm_model", description=__doc__.split("\n")[0])
    p.add_argument("--cache-dir", type=Path, default=CACHE_DIR, help=f"where models are kept (default {CACHE_DIR})")
    p.add_argument("--ranks", default=",".join(map(str, RANKS)), help="comma-separated LoRA ranks")
    p.add_argument("--shape", choices=sorted(SHAPES), default=TINY.name, help="the model's shape (default tiny)")
    args = p.parse_args(argv)
    model = tiny_model(args.cache_dir, [int(r) for r in args.ranks.split(",") if r], SHAPES[args.shape])
    print(model.root)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
