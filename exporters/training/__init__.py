"""Training telemetry (guide 2.3, 2.5): the ``loadlens_training_*`` series of a LoRA fine-tuning run.

``maths`` holds the pure calculations (EMA, jump ratio, VRAM fluctuation window, LoRA update correlation,
the checkpoint policy), ``metrics`` the series and their /metrics server, ``hook`` the plain-PyTorch hook
(``TrainingTelemetry``) and ``callback`` the ``transformers.TrainerCallback`` (imports transformers; nothing
here imports it, so the package works without it). ``demo`` is `make train-demo`. docs/training.md.
"""
