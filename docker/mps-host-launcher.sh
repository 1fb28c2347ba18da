#!/bin/sh
# The mps-host bundle's launcher (copied into the bundle as hypha-accelerate-mps). Runs the
# Hypha executor natively on macOS, where Docker cannot reach Metal. Takes the image
# launcher's arguments (--socket --work-dir --job ...).
#
# First use makes a venv from the bundle's pinned requirements and wheel: beside this script,
# or at HYPHA_MPS_VENV. Needs CPython 3.11 on PATH as python3.11 (or PYTHON=).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
venv=${HYPHA_MPS_VENV:-$here/venv}
python=${PYTHON:-python3.11}

if [ ! -x "$venv/bin/python" ]; then
    # Two jobs may start at once: one makes the venv under a lock, the other waits for it.
    if mkdir "$venv.lock" 2>/dev/null; then
        # A cancel during the install must not leave the lock behind for the next job.
        trap 'rmdir "$venv.lock"' EXIT
        trap 'exit 143' TERM
        trap 'exit 130' INT
        echo "hypha-accelerate-mps: installing the executor into $venv (first use)" >&2
        rm -rf "$venv.tmp"
        "$python" -m venv "$venv.tmp" >&2
        "$venv.tmp/bin/pip" install --quiet --disable-pip-version-check \
            --requirement "$here/requirements.txt" >&2
        "$venv.tmp/bin/pip" install --quiet --disable-pip-version-check --no-deps \
            "$here"/hypha_accelerate_executor-*.whl >&2
        mv "$venv.tmp" "$venv"
        rmdir "$venv.lock"
        trap - EXIT TERM INT
    else
        waited=0
        while [ ! -x "$venv/bin/python" ]; do
            if [ "$waited" -ge 600 ]; then
                echo "hypha-accelerate-mps: gave up waiting for $venv (remove $venv.lock if stale)" >&2
                exit 1
            fi
            sleep 1
            waited=$((waited + 1))
        done
    fi
fi

export HYPHA_VARIANT=mps-host
export HYPHA_ACCELERATE_CONFIGS="$here/accelerate-configs"
export PYTHONUNBUFFERED=1
# Operators missing on Metal run on the CPU instead of failing the job.
export PYTORCH_ENABLE_MPS_FALLBACK=1
exec "$venv/bin/python" -m hypha.accelerate_executor.platform.launcher "$@"
