#!/usr/bin/env bash
# The GPU acceptance run, first half: on a machine with the network, put into one folder
# what a bare GPU machine lacks to run the second half (run.sh) from this checkout.
#
#   bash bench/gpu_acceptance/prepare.sh
#
# The GPU machine this project is sometimes lent has Python 3.12 with torch, accelerate,
# transformers, PyYAML, ninja and nvcc, but no pydantic, no DeepSpeed, and no network. This
# writes their wheels, and the project's own, into .gpu-acceptance/wheels/ (git-ignored;
# under 64 MiB, what travels with the working tree). Settings, by environment variable:
#   HYPHA_ACCEPTANCE_PYTHON   the Python version the wheels are for (default 3.12, the GPU
#                             machine's); the local dry run passes this machine's
#   PYTHON                    the interpreter that builds the wheels; it needs torch, which
#                             DeepSpeed's setup imports (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${PYTHON:-.venv/bin/python}
# pip's complaints about index folders this machine's pip.conf names but lacks are noise.
pip() { "$python" -m pip "$@" 2> >(grep -v '^WARNING: Location' >&2); }
target=${HYPHA_ACCEPTANCE_PYTHON:-3.12}
wheels=.gpu-acceptance/wheels
rm -rf "$wheels"
mkdir -p "$wheels"

# The versions the images pin, so that the GPU run tests what ships.
pin() { sed -n -E "s/^$1==([^ ;#]+).*/\1/p" docker/requirements/common.txt docker/requirements/deepspeed.txt | head -n 1; }
binary=()
for name in pydantic pydantic-core annotated-types typing-inspection typing-extensions hjson cramjam blake3; do
    binary+=("$name==$(pin "$name")")
done
platforms=()
for n in 17 27 28 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
pip download -q --no-deps --only-binary=:all: --python-version "$target" \
    --implementation cp "${platforms[@]}" -d "$wheels" "${binary[@]}"
# DeepSpeed ships only a source archive: built here without ops (they JIT-build on the GPU
# machine with its nvcc), as the images install it.
DS_BUILD_OPS=0 pip wheel -q --no-deps --no-build-isolation -w "$wheels" \
    "deepspeed==$(pin deepspeed)"
pip wheel -q --no-deps --no-build-isolation -w "$wheels" .
# Liger's kernels (pure Python over Triton) for compile_variants.py's fused linear-plus-
# cross-entropy variant only: the executor does not depend on them.
pip download -q --no-deps -d "$wheels" liger-kernel==0.8.5

size=$(du -sm "$wheels" | cut -f1)
if [ "$size" -ge 64 ]; then
    echo "prepare: $wheels holds $size MiB, over the 64 MiB that can travel" >&2
    exit 1
fi
echo "prepare: $(ls "$wheels" | wc -l) wheels, $size MiB, in $wheels for Python $target:"
ls "$wheels"
