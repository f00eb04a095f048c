#!/usr/bin/env bash
# Prepare, on a machine with PyPI, what benchmarks/gpu_smoke.sh needs on the GPU machine: a bare CUDA image with
# Python 3.12, torch and Lightning but no network and none of geocont's other dependencies.
#
#   bash benchmarks/gpu_smoke_wheels.sh        # from the repository root; writes .gpu-smoke/a and .gpu-smoke/b
#
# 1. Downloads cp312 manylinux x86_64 wheels (pinned below) of every geocont dependency the image lacks, with the
#    device README's `pip download --no-deps` command, and checks the set is closed: every Requires-Dist of every
#    wheel (ray with its `tune` extra) is either one of these wheels or a package the image already has.
# 2. Installs them into one folder (pip --target, no bytecode), drops ray/jars (Java workers only: 33 MB that
#    neither compresses nor runs here), and packs it as one tar.xz.
# 3. Splits the archive in two: .gpu-smoke/a/ (the first half) and .gpu-smoke/b/ (the second half, MNIST's four
#    .gz files and the archive's sha256). Each travels in one device call and stays under the 64 MiB a call
#    allows, the working tree included (checked at the end).
#
# Not carried: vl-convert-python (33 MB; only `geocont report --figures` uses it) and the `text`/`dev` extras.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
MNIST=${MNIST:-../shared/mnist}
DEST=.gpu-smoke
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
LIMIT=$((64 * 1024 * 1024))

# geocont's dependencies (pyproject.toml) and their closure, less what the image has (IMAGE_HAS): resolved for
# CPython 3.12 on manylinux x86_64 in 2026-12.
WHEELS=(
  ray==2.60.0 tensorboardX==2.6.5 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0
  rpds-py==2026.9.1
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  polars==2.1.0 polars-runtime-32==2.1.0
  wandb==0.31.0 cwevals==0.0.1b1 distro==1.9.0 httpx2==2.16.2 httpcore2==2.16.2 platformdirs==4.14.9
  sniffio==1.3.1 truststore==0.10.5 googleapis-common-protos==1.76.0 opentelemetry-api==1.45.2
  opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2 opentelemetry-semantic-conventions==0.66b2
  opentelemetry-exporter-otlp-proto-http==1.45.2 opentelemetry-exporter-otlp-proto-common==1.45.2
  opentelemetry-exporter-http-transport==0.66b2 opentelemetry-exporter-otlp-common==0.66b2
  optuna==5.0.0 alembic==1.20.1 sqlalchemy==2.1.9 Mako==1.4.3 colorlog==6.12.0
  altair==6.3.0 tzdata==2026.6
)
# The image's Python packages (the device's KINDS.md, read 2026-11-17), normalised names.
IMAGE_HAS="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs certifi
charset-normalizer click cloudpickle colorama contourpy cuda-bindings cuda-toolkit cycler filelock fonttools
fsspec grpcio h11 h5py hf-xet httpcore httpx huggingface-hub idna jinja2 joblib kiwisolver lightning
lightning-utilities markdown markdown-it-py markupsafe matplotlib mdurl mpmath msgpack multidict narwhals networkx
numpy nvidia-ml-py packaging pandas pillow pip pluggy prometheus-client propcache protobuf psutil pyarrow pygments
pyparsing python-dateutil pytorch-lightning pyyaml regex requests rich safetensors scikit-learn scipy setuptools
shellingham six sympy tensorboard tensorboard-data-server threadpoolctl tokenizers torch torchmetrics tqdm triton
typer typing-extensions urllib3 werkzeug wheel wrapt xxhash yarl zipp"

echo "== download ${#WHEELS[@]} wheels"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$WORK/whl" "${WHEELS[@]}"

echo "== check the closure (Requires-Dist of every wheel)"
IMAGE_HAS="$IMAGE_HAS" "$PYTHON" - "$WORK/whl" <<'EOF'
import os, re, sys, zipfile
from pathlib import Path
from packaging.requirements import Requirement

def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()

wheels = sorted(Path(sys.argv[1]).glob("*.whl"))
have = {norm(w.name.split("-")[0]) for w in wheels} | {norm(n) for n in os.environ["IMAGE_HAS"].split()}
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
       "implementation_name": "cpython", "platform_python_implementation": "CPython"}
extras = {"ray": {"tune"}}  # geocont asks for ray[tune]
missing = []
for wheel in wheels:
    name = norm(wheel.name.split("-")[0])
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    for line in lines:
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        wanted = req.marker is None or any(
            req.marker.evaluate({**env, "extra": extra}) for extra in ({""} | extras.get(name, set()))
        )
        if wanted and norm(req.name) not in have:
            missing.append(f"{wheel.name}: {req}")
print(f"{len(wheels)} wheels; every requirement is a wheel here or in the image" if not missing else "")
if missing:
    sys.exit("missing from the wheels and the image:\n  " + "\n  ".join(missing))
EOF

echo "== install into one folder, pack, split"
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site" \
  --python-version 3.12 --implementation cp --only-binary=:all: \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  "$WORK"/whl/*.whl
rm -rf "$WORK/site/ray/jars" "$WORK/site/bin"
tar -C "$WORK/site" -cf - . | xz -T0 -6 > "$WORK/site.tar.xz"
rm -rf "$DEST" && mkdir -p "$DEST/a" "$DEST/b/mnist"
split -n 2 -d "$WORK/site.tar.xz" "$WORK/site.tar.xz.part"
mv "$WORK/site.tar.xz.part00" "$DEST/a/"
mv "$WORK/site.tar.xz.part01" "$DEST/b/"
(cd "$WORK" && sha256sum site.tar.xz) > "$DEST/b/site.tar.xz.sha256"
if [ -d "$MNIST" ]; then
  cp "$MNIST"/*-ubyte.gz "$DEST/b/mnist/"
else
  echo "warning: no MNIST at $MNIST (MNIST=DIR sets it); the smoke's MLP parts will need it" >&2
fi

echo "== sizes (limit 64 MiB a call, working tree included)"
tree=$(git ls-files -z --cached --others --exclude-standard | du --files0-from=- -cb | tail -1 | cut -f1)
status=0
for part in a b; do
  carry=$(du -sb "$DEST/$part" | cut -f1)
  total=$((tree + carry))
  awk -v p="$DEST/$part" -v c="$carry" -v t="$tree" \
    'BEGIN { printf "%s: %5.1f MiB carried + %4.1f MiB working tree = %5.1f MiB\n", p, c / 2^20, t / 2^20, (c + t) / 2^20 }'
  [ "$total" -le "$LIMIT" ] || { echo "  over the limit" >&2; status=1; }
done
exit $status
