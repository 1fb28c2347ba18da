#!/usr/bin/env bash
# The test command: a virtual environment with the project, the cpu image, lint, types, tests.
#
#   bash tests/run.sh [PYTEST ARGS...]
#   bash tests/run.sh --torch VERSION|VARIANT [PYTEST ARGS...]
#
# Needs Python 3.11+ and a running Docker engine. Online (the default) the image builds from
# python:3.11-slim-bookworm and PyPI; with HYPHA_OFFLINE=1 (what .ci/run sets) the base image
# is made with debootstrap and the image installs from a local wheelhouse instead.
# HYPHA_ARM64=1 also builds the arm64 cpu image, under QEMU emulation on an amd64 host (tens of
# minutes: .ci/run says how long), and runs the tests marked arm64, which the default
# selection leaves out.
#
# --torch runs the part of the suite that touches torch, Accelerate, Transformers and DeepSpeed
# (everything but the image, shim, Docker, serde-oracle and benchmark tests) on the torch a variant
# carries: VERSION (2.8, 2.9.0, ...) picks the variant whose docker/requirements file pins that
# torch, VARIANT (cu129, ...) names it. Its venv, .venv-torch-<torch>/ (cached), gets the
# variant's closure with PyPI's build of the same torch version (the variant's own build lives
# on the PyTorch index; a CPU-only machine runs PyPI's CUDA build on the CPU), or the local
# +cpu build for the cpu variant. No Docker needed. PYTEST ARGS replace the default selection.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's python3 can be run by any uid (tests run containers as a non-root one).
python=${PYTHON:-$(command -v /usr/bin/python3 || command -v python3)}
# pip's complaints about index folders this machine's pip.conf names but lacks are noise.
pip_install() { "$venv/bin/pip" install -q "$@" 2> >(grep -v '^WARNING: Location' >&2); }

# The variants whose torch --torch VERSION may name, in the order they are looked up:
# the cpu variant first, so that 2.13 is the default venv's own +cpu build.
matrix_variants=(cpu cu129 rocm64 cu128 cu126 cu130)

# The torch a requirements file pins, e.g. 2.8.0+cu129.
pinned_torch() { sed -n -E 's/^torch *===? *([0-9][^ ;#]*).*/\1/p' "$1"; }

# Which variant --torch ARG means: a variant's name, or a torch version (2.8, 2.8.0) that a
# variant pins.
matrix_variant() {
    local arg=$1 variant version pins=()
    if [ -f "docker/requirements/$arg.txt" ]; then
        echo "$arg"
        return
    fi
    for variant in "${matrix_variants[@]}"; do
        version=$(pinned_torch "docker/requirements/$variant.txt")
        pins+=("$variant=$version")
        case ${version%%+*} in "$arg" | "$arg".*)
            echo "$variant"
            return
            ;;
        esac
    done
    echo "run.sh: no variant carries torch $arg (docker/requirements pins ${pins[*]})" >&2
    exit 2
}

# The variant's requirements with PyPI's build of its torch version in place of the index
# build (torch, and the triton its index build pins), includes made absolute.
matrix_requirements() {
    local variant=$1 version
    version=$(pinned_torch "docker/requirements/$variant.txt")
    echo "# docker/requirements/$variant.txt, torch from PyPI (written by tests/run.sh --torch)"
    grep -v -E '^(torch|triton|pytorch-triton[a-z-]*) *[=<>~!]' "docker/requirements/$variant.txt" |
        sed -E "s#^(-r|--requirement) +#\1 $PWD/docker/requirements/#"
    # `===` refuses a local label: 2.13.0 must not be satisfied by the machine's 2.13.0+cpu.
    case $version in
        *+cpu) echo "torch==$version" ;;
        *) echo "torch===${version%%+*}" ;;
    esac
}

if [ "${1:-}" = --torch ]; then
    [ $# -ge 2 ] || { echo "usage: bash tests/run.sh --torch VERSION|VARIANT [PYTEST ARGS...]" >&2; exit 2; }
    variant=$(matrix_variant "$2")
    shift 2
    requirements=$(matrix_requirements "$variant")
    torch=$(sed -n -E 's/^torch *===? *//p' <<<"$requirements")
    venv=.venv-torch-$torch
    # The venv is reused while the requirements and the project's own dependencies are as
    # they were when it was made.
    stamp=$(printf '%s\n' "$requirements" | cat - pyproject.toml docker/requirements/*.txt | sha256sum | cut -c1-16)
    if [ "$(cat "$venv/.hypha-stamp" 2>/dev/null)" != "$stamp" ]; then
        echo "== venv $venv: $variant's closure with torch $torch"
        [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
        printf '%s\n' "$requirements" >"$venv/requirements.txt"
        # DeepSpeed's sdist builds no op (the GPU images install it the same way).
        torch_index=()
        [[ $torch != *+cpu || ${HYPHA_OFFLINE:-0} = 1 ]] ||
            torch_index=(--extra-index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}")
        DS_BUILD_OPS=0 pip_install "${torch_index[@]}" -r "$venv/requirements.txt" \
            -r docker/requirements/cluster.txt -e '.[local]' pytest
        echo "$stamp" >"$venv/.hypha-stamp"
    fi
    export PATH="$PWD/$venv/bin:$PATH"
    # DeepSpeed's CPU path JIT-builds an op: one build per torch, kept with its venv (below).
    export TORCH_EXTENSIONS_DIR=$PWD/$venv/torch-extensions
    python -c 'from importlib.metadata import version as v
print("== tests on", ", ".join(f"{p} {v(p)}" for p in ("torch", "transformers", "accelerate", "deepspeed")))'
    if [ $# -eq 0 ]; then
        set -- tests --ignore=tests/images --ignore=tests/shim --ignore=tests/tools --ignore=tests/bench \
            -m 'not docker and not oracle and not cuda_image'
    fi
    exec pytest "$@"
fi

venv=.venv
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
# Install the pinned CPU torch first: an unpinned `torch` would pull the CUDA build.
if ! .venv/bin/python -c 'import torch' 2>/dev/null; then
    torch_index=()
    [ "${HYPHA_OFFLINE:-0}" = 1 ] || torch_index=(--index-url "${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}")
    pip_install "${torch_index[@]}" torch==2.13.0
fi
pip_install -e '.[dev]' torch==2.13.0
export PATH="$PWD/.venv/bin:$PATH"
# DeepSpeed's CPU path JIT-builds an op, kept with the venv: a build killed half-way in a shared
# ~/.cache/torch_extensions leaves a lock that every later build waits on forever.
export TORCH_EXTENSIONS_DIR=$PWD/.venv/torch-extensions

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

if [ "${HYPHA_ARM64:-0}" = 1 ]; then
    echo "== arm64 cpu image"
    arm64_started=$(date +%s)
    if [ "${HYPHA_OFFLINE:-0}" = 1 ]; then
        hypha-accelerate build cpu --arch arm64 --offline
    else
        hypha-accelerate build cpu --arch arm64
    fi
    echo "== arm64 cpu image built in $(($(date +%s) - arm64_started)) s"
    # The default selection without its `not arm64`.
    [ $# -gt 0 ] || set -- -m 'not cuda_image'
fi

echo "== tests"
# pytest exits 5 when it collects nothing: that fails here too.
exec pytest "$@"
