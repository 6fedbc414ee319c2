"""Runtime LoRA adapters at the serving layer: path confinement and the served-name registry."""

from __future__ import annotations

import itertools
from pathlib import Path

from exporters.serving.engine import LoRARequest
from exporters.serving.protocol import RequestError


def resolve_adapter_path(root: Path | None, raw: str) -> Path:
    """Resolve ``raw`` (absolute, or relative to ``root``) and require it to stay inside ``root``.

    Symlinks are followed before the check, so a link that points outside the root is refused too.
    """
    if root is None:
        raise RequestError(
            "runtime LoRA loading is disabled: start the server with --lora-root DIR (LOADLENS_LORA_ROOT)",
            "lora_path",
        )
    if "\x00" in raw:
        raise RequestError("lora_path contains a NUL byte", "lora_path")
    root_real = root.resolve()
    candidate = Path(raw)
    if not candidate.is_absolute():
        candidate = root_real / candidate
    real = candidate.resolve(strict=False)
    if not real.is_relative_to(root_real):
        raise RequestError(f"lora_path must resolve inside the adapter root {root_real}", "lora_path")
    return real


class AdapterRegistry:
    """Served adapter names -> LoRARequest, with vLLM-style integer ids (>= 1, never reused)."""

    def __init__(self) -> None:
        self._by_name: dict[str, LoRARequest] = {}
        self._ids = itertools.count(1)

    def make(self, name: str, path: Path) -> LoRARequest:
        return LoRARequest(lora_name=name, lora_int_id=next(self._ids), lora_path=str(path))

    def add(self, lora: LoRARequest) -> None:
        self._by_name[lora.lora_name] = lora

    def remove(self, name: str) -> LoRARequest | None:
        return self._by_name.pop(name, None)

    def get(self, name: str) -> LoRARequest | None:
        return self._by_name.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def names(self) -> list[str]:
        return sorted(self._by_name)
