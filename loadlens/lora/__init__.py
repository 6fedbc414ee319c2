"""``loadlens lora``: LoRA adapters made offline (docs/lora.md).

``shapes`` reads a base model's linear-module shapes (Hugging Face ``config.json``, a model directory or a
packaged sim model profile), ``sizes`` sizes an adapter by the guide's formula, ``writer`` writes a PEFT
adapter (``adapter_config.json`` + ``adapter_model.safetensors``, without torch), ``make`` is the library entry
point (``make_adapter``) and ``cli`` wires ``lora make`` to it. Importing this package needs no numpy; writing does.
"""

from loadlens.lora.make import AdapterReport, make_adapter
from loadlens.lora.shapes import LoraError

__all__ = ["AdapterReport", "LoraError", "make_adapter"]
