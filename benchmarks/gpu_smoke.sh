#!/usr/bin/env bash
# The GPU smoke in one command, on a one-GPU machine with a bare CUDA image (Python 3.12, torch, Lightning; no
# network, none of geocont's other dependencies): installs what benchmarks/gpu_smoke_wheels.sh packed into
# .gpu-smoke/, then runs benchmarks/gpu_smoke.py (see its docstring for the parts) on MNIST from .gpu-smoke/b/mnist.
#
#   bash benchmarks/gpu_smoke.sh stage     # device call 1, carry .gpu-smoke/a: keeps the first half in /tmp
#   bash benchmarks/gpu_smoke.sh           # device call 2 (at once, same warm machine), carry .gpu-smoke/b
#   GPU_SMOKE_ALLOW_CPU=1 bash benchmarks/gpu_smoke.sh   # a dry run on this machine's CPU (its own packages)
#
# Budget on one H200: 8 minutes in all, installation included; the Python part runs under `timeout`
# (GPU_SMOKE_LIMIT_S, default 420 s) and writes its results after every part, so a slow part still leaves the
# others' numbers. Results and the log go to $OUT (the device tool brings that folder back), else a temp dir.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
STASH=/tmp/gpu-smoke
ARCHIVE=site.tar.xz
started=$SECONDS
phase() { printf '== %-40s %5d s since start\n' "$1" $((SECONDS - started)); }

if [ "${1:-}" = stage ]; then
  mkdir -p "$STASH"
  cp .gpu-smoke/a/$ARCHIVE.part* "$STASH/"
  ls -l "$STASH"
  exit 0
fi

results=${OUT:-$(mktemp -d)}
mkdir -p "$results"
mnist=${MNIST:-../shared/mnist}
imports="import pydantic, polars, ray, wandb"
if "$PYTHON" -c "$imports" 2>/dev/null; then
  phase "geocont's packages already importable"
elif [ -d "$STASH/site" ] && PYTHONPATH="$STASH/site" "$PYTHON" -c "$imports" 2>/dev/null; then
  export PYTHONPATH="$STASH/site${PYTHONPATH:+:$PYTHONPATH}"   # installed by an earlier call on this machine
  mnist=$STASH/mnist
  phase "packages installed by an earlier call"
else
  phase "install the carried packages"
  first=$(ls "$STASH"/$ARCHIVE.part00 .gpu-smoke/a/$ARCHIVE.part00 2>/dev/null | head -1 || true)
  [ -n "$first" ] || { echo "no $ARCHIVE.part00: run 'bash benchmarks/gpu_smoke.sh stage' carrying .gpu-smoke/a first" >&2; exit 2; }
  mkdir -p "$STASH/site"
  cat "$first" .gpu-smoke/b/$ARCHIVE.part01 > "$STASH/$ARCHIVE"
  (cd "$STASH" && sha256sum -c "$OLDPWD/.gpu-smoke/b/$ARCHIVE.sha256") >/dev/null \
    || { echo "$ARCHIVE: checksum mismatch (parts from two different packings?)" >&2; exit 2; }
  "$PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2], filter="data")' \
    "$STASH/$ARCHIVE" "$STASH/site"
  rm "$STASH/$ARCHIVE"
  export PYTHONPATH="$STASH/site${PYTHONPATH:+:$PYTHONPATH}"
  rm -rf "$STASH/mnist" && cp -r .gpu-smoke/b/mnist "$STASH/mnist"   # kept for a rerun on the warm machine
  mnist=$STASH/mnist
  phase "installed"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0
export GEOCONT_CACHE="$STASH/cache" WANDB_SILENT=true

command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
mnist_arg=()
[ -d "$mnist" ] && mnist_arg=(--mnist "$mnist") || echo "no MNIST at $mnist: the MLP parts use digits" >&2

phase "gpu_smoke.py"
set +e
timeout "${GPU_SMOKE_LIMIT_S:-420}" "$PYTHON" benchmarks/gpu_smoke.py "${mnist_arg[@]}" \
  --json "$results/gpu_smoke.json" "$@" 2>&1 | tee "$results/gpu_smoke.log"
status=${PIPESTATUS[0]}
set -e
phase "done (exit $status; results in $results)"
exit "$status"
