"""loadlens GPU exporter: NVML (or simulated) device metrics, utilisation swings, VRAM fragmentation.

Run it with ``loadlens gpu-exporter`` (see docs/gpu-exporter.md). Layout:

- :mod:`.nvml`: typed facade over a pynvml-shaped API; every unit conversion happens here.
- :mod:`.sim`: the ``sim`` backend (device-state document behind pynvml's call surface) and its faults.
- :mod:`.session`: NVML lifecycle, device enumeration, lost GPUs, re-initialisation.
- :mod:`.sampler`: background thread reading the driver's sample buffers for the rolling window.
- :mod:`.collectors`: one collector per concern; :mod:`.collector` holds their base and the exporter.
- :mod:`.server`: assembly and the HTTP server (``/metrics``, ``/health``).
"""
