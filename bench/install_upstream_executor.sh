#!/usr/bin/env bash
# Installs Hypha's own executor (upstream's executors/accelerate, from a checkout of
# hypha-space/hypha that you give) into a virtual environment outside this repository, for
# `bench/upstream_rounds.py --upstream VENV/bin/python` and `bench/run.py --against`.
#
#     bench/install_upstream_executor.sh CHECKOUT/executors/accelerate VENV [PYTHON]
#
# PYTHON (default /usr/bin/python3) may be 3.11: upstream asks for 3.12 only for
# `typing.override`, which a .pth line takes from typing_extensions. The pins are upstream's
# (transformers 4.56.2, accelerate 1.10.1) with this project's torch; the action-era modules
# also import numpy, python-snappy and OpenTelemetry, which its 2025-11-21 pyproject does not
# list, so they are named here. No upstream code is kept in this repository.
set -euo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
    echo "usage: $0 CHECKOUT/executors/accelerate VENV [PYTHON]" >&2
    exit 2
fi
source_dir=$(realpath "$1")
venv=$(realpath -m "$2")
python=${3:-/usr/bin/python3}

if [[ ! -f $source_dir/pyproject.toml || ! -d $source_dir/src/hypha/accelerate_executor ]]; then
    echo "$0: $source_dir is not upstream's executors/accelerate" >&2
    exit 2
fi
# Its package is also named hypha.accelerate_executor: inside this repository it could be
# imported in place of this project's.
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
if [[ $venv/ == "$repo"/* ]]; then
    echo "$0: put the venv outside this repository ($repo)" >&2
    exit 2
fi

"$python" -m venv "$venv"
"$venv/bin/pip" install -q torch==2.13.0 transformers==4.56.2 accelerate==1.10.1 \
    'httpx>=0.28.1' safetensors numpy python-snappy typing_extensions \
    opentelemetry-sdk opentelemetry-exporter-otlp-proto-http \
    opentelemetry-instrumentation-system-metrics
# --ignore-requires-python: its `requires-python = ">=3.12"` is for typing.override only.
"$venv/bin/pip" install -q --no-deps --ignore-requires-python "$source_dir"
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "import typing, typing_extensions; typing.override = getattr(typing, 'override', typing_extensions.override)" \
    >"$site/hypha_typing_override.pth"
"$venv/bin/python" -c 'import hypha.accelerate_executor.training, hypha.accelerate_executor.dataset'
echo "$venv/bin/python"
