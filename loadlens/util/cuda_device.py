"""What a process's ``torch.cuda`` says about a device, in the form the GPU exporter joins on."""

from __future__ import annotations

from typing import Any


def device_uuid(cuda: Any, index: int) -> str:
    """NVML's spelling of the device's UUID (``GPU-…``), the key that joins in-process series to the exporter's
    NVML series (CUDA indices differ from NVML's under ``CUDA_VISIBLE_DEVICES``); "" on a torch without it."""
    try:
        raw = str(cuda.get_device_properties(index).uuid)
    except Exception:  # older torch has no uuid property
        return ""
    return raw if raw.startswith("GPU-") else f"GPU-{raw}"
