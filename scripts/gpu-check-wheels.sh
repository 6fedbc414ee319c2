#!/usr/bin/env bash
# Wheels for `make gpu-check` on a GPU host that cannot reach PyPI (benchmarks/README.md).
#
#   scripts/gpu-check-wheels.sh download [DIR]   # here, where PyPI is reachable (default DIR: .whl)
#   scripts/gpu-check-wheels.sh install  [DIR] [TARGET]   # there; then export PYTHONPATH=TARGET
#
# download: the versions this checkout's .venv holds (so the GPU run uses what the tests used), for
# GPU_PYVER (default 3.12: the H200 image's python3 is 3.12.3; set 3.11 for a 3.11 host), linux x86_64,
# binary wheels only and --no-deps: torch (CUDA build), numpy, pyyaml, requests and the like are on the GPU
# image and must not be replaced, so every wheel is named here. About 22 MB for 3.12 (transformers 13.5 MB, tokenizers 3.4 MB, pydantic_core 2.3 MB), measured here.
# install: only the distributions python3 there lacks (the image's own transformers/peft stay), into
# TARGET (default /tmp/gpu-check-site), offline: pip install --no-index --no-deps --find-links DIR.
set -euo pipefail
cmd=${1:-}
dir=${2:-.whl}
# What the check imports beyond the image: pydantic and its parts (exporters.probe, the probe reader).
# The Hugging Face stack too, for a host without it.
NAMES=(pydantic pydantic_core annotated-types typing-inspection
       transformers peft accelerate safetensors tokenizers huggingface-hub)
case "$cmd" in
download)
    py=${PY:-.venv/bin/python}
    pyver=${GPU_PYVER:-3.12}
    specs=()
    for name in "${NAMES[@]}"; do
        specs+=("$name==$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
    done
    mkdir -p "$dir"
    "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$pyver" --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d "$dir" "${specs[@]}"
    du -ch "$dir"/*.whl | tail -1
    ;;
install)
    target=${3:-/tmp/gpu-check-site}
    py=${PY:-python3}
    missing=()
    for name in "${NAMES[@]}"; do
        "$py" -c "import importlib.metadata as m, sys; m.version(sys.argv[1])" "$name" 2>/dev/null || missing+=("$name")
    done
    if [ ${#missing[@]} -eq 0 ]; then echo "gpu-check-wheels: nothing missing"; exit 0; fi
    echo "gpu-check-wheels: installing ${missing[*]} into $target"
    "$py" -m pip install --quiet --no-index --no-deps --no-compile --find-links "$dir" --target "$target" "${missing[@]}"
    echo "export PYTHONPATH=$target\${PYTHONPATH:+:\$PYTHONPATH}"
    ;;
*)
    echo "usage: $0 download [DIR] | install [DIR] [TARGET]" >&2
    exit 2
    ;;
esac
