"""``loadlens lora``: LoRA adapters made offline (docs/lora.md).

``shapes`` reads a base model's linear-module shapes (Hugging Face ``config.json``, a model directory or a
packaged sim model profile), ``sizes`` sizes an adapter by the guide's formula, ``writer`` writes a PEFT
adapter (``adapter_config.json`` + ``adapter_model.safetensors``, without torch), ``cli`` wires ``lora make``.
"""
