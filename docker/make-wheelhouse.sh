#!/bin/sh
# Collect every wheel an offline image build of VARIANT needs into one folder of the build
# context: the pinned requirements (sdists such as DeepSpeed built into wheels, with
# DS_BUILD_OPS=0), the local cluster's few extra packages (cluster.txt, for compose.yaml),
# plus setuptools and wheel for building the project wheel. Uses the
# host's pip and its configuration (here: torch 2.13.0+cpu from /opt/wheels). The host's
# Python must match the image's (CPython 3.11 on Linux x86_64) for the wheels to fit.
# Several variants may share one DEST: each pins its own torch build (cu130's `===` pin
# refuses the +cpu one), so compose's one wheelhouse can serve a GPU executor and the
# cluster's cpu image.
#
# usage: docker/make-wheelhouse.sh VARIANT [DEST]
#   VARIANT  a file name under docker/requirements/ without .txt (cpu, ci-standin-cu126, ...)
#   DEST     default docker/wheelhouse/VARIANT (git-ignored)
set -eu

if [ $# -lt 1 ]; then
    echo "usage: docker/make-wheelhouse.sh VARIANT [DEST]" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
variant=$1
requirements=$here/requirements/$variant.txt
dest=${2:-$here/wheelhouse/$variant}
python=${PYTHON:-python3}

if [ "$variant" = cluster ]; then
    echo "make-wheelhouse: cluster.txt goes into every variant's wheelhouse; name a variant (cpu, cu130, ...)" >&2
    exit 2
fi
if [ ! -f "$requirements" ]; then
    echo "make-wheelhouse: no requirements for $variant ($requirements)" >&2
    exit 2
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
    echo "make-wheelhouse: $python is not CPython 3.11 (set PYTHON=); the image runs 3.11" >&2
    exit 1
fi

mkdir -p "$dest"
echo "wheelhouse $dest <- $requirements"
log=$(mktemp /tmp/hypha-wheelhouse.XXXXXX)
case $variant in
*-arm64)
    # Another architecture's wheels: pip's --platform picks aarch64 files, but it evaluates
    # environment markers for this host (x86_64), so its resolver would chase torch's x86_64-only
    # CUDA requirements. The pins are the whole closure, so download exactly them, each without
    # dependencies; the image build's pip (arm64, under emulation) resolves the markers for
    # real and fails on anything missing. Sdists (DeepSpeed) are pure Python: built here.
    pins=$(mktemp /tmp/hypha-pins.XXXXXX)
    "$python" - "$requirements" "$here/requirements/cluster.txt" >"$pins" <<'PY'
import sys
from pathlib import Path
sys.path.insert(0, str(Path(sys.argv[1]).parents[2] / "src"))
from hypha.accelerate_executor.platform.variants import requirement_lines
for name in sys.argv[1:]:
    print("\n".join(requirement_lines(Path(name))))
PY
    printf '%s\n' "setuptools>=68" wheel >>"$pins"
    # --platform names tags exactly: every glibc the image's (2.36) runs, from manylinux2014's.
    platforms=$(for minor in $(seq 17 28); do printf ' --platform manylinux_2_%s_aarch64' "$minor"; done)
    {
        grep -v '^deepspeed==' "$pins" >"$pins.wheels" &&
        "$python" -m pip download --disable-pip-version-check --no-deps --dest "$dest" \
            --only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 \
            $platforms --platform manylinux2014_aarch64 --platform any --requirement "$pins.wheels" &&
        if grep -q '^deepspeed==' "$pins"; then
            DS_BUILD_OPS=0 "$python" -m pip wheel --disable-pip-version-check --no-deps \
                --wheel-dir "$dest" "$(grep '^deepspeed==' "$pins")"
        fi
    } >"$log" 2>&1 || {
        tail -n 20 "$log" >&2
        echo "make-wheelhouse: pip download failed for $variant (whole log: $log)" >&2
        exit 1
    }
    rm -f "$pins" "$pins.wheels" "$log"
    echo "wheelhouse $dest ready: $(ls "$dest" | wc -l) wheels (linux/arm64)"
    exit 0
    ;;
esac
DS_BUILD_OPS=0 "$python" -m pip wheel --disable-pip-version-check --wheel-dir "$dest" \
    --requirement "$requirements" --requirement "$here/requirements/cluster.txt" \
    "setuptools>=68" wheel >"$log" 2>&1 || {
    tail -n 20 "$log" >&2
    echo "make-wheelhouse: pip wheel failed for $variant (whole log: $log)" >&2
    exit 1
}
rm -f "$log"
echo "wheelhouse $dest ready: $(ls "$dest" | wc -l) wheels"
