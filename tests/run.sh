#!/usr/bin/env bash
# The test command: a virtual environment with the project, the cpu image, lint, types, tests.
#
#   bash tests/run.sh [PYTEST ARGS...]
#
# Needs Python 3.11+ and a running Docker engine. Online (the default) the image builds from
# python:3.11-slim-bookworm and PyPI; with HYPHA_OFFLINE=1 (what .ci/run sets) the base image
# is made with debootstrap and the image installs from a local wheelhouse instead.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's python3 can be run by any uid (tests run containers as a non-root one).
python=${PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
# pip's complaints about index folders this machine's pip.conf names but lacks are noise.
pip_install() { .venv/bin/pip install -q "$@" 2> >(grep -v '^WARNING: Location' >&2); }
# Install the pinned CPU torch first: an unpinned `torch` would pull the CUDA build.
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    torch_index=()
    [ "${HYPHA_OFFLINE:-0}" = 1 ] || torch_index=(--index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}")
    pip_install "${torch_index[@]}" torch==2.13.0
fi
pip_install -e '.[dev]' torch==2.13.0
export PATH="$PWD/.venv/bin:$PATH"

echo "== lint and types"
ruff check src tests bench
ruff format --check src tests bench
mypy

echo "== cpu image"
if [ "${HYPHA_OFFLINE:-0}" = 1 ]; then
    hypha-accelerate build cpu --offline
else
    hypha-accelerate build cpu
fi

echo "== tests"
# pytest exits 5 when it collects nothing: that fails here too.
exec pytest "$@"
