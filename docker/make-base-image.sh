#!/bin/sh
# Make the offline stand-in for python:3.11-slim-bookworm: a Debian bookworm minbase root fs
# with python3 3.11, its venv module and CA certificates, imported as a Docker image.
# Needs root, debootstrap and Debian's package archive. Skips when the image exists.
# ARCH=arm64 makes an arm64 root on an amd64 host: debootstrap's second stage then runs
# arm64 programs, through QEMU user emulation (qemu-user-static, binfmt-support).
#
# usage: [ARCH=amd64|arm64] docker/make-base-image.sh [IMAGE]
#   IMAGE  default hypha-accelerate-base:bookworm (amd64), hypha-accelerate-base:bookworm-arm64
set -eu

arch=${ARCH:-amd64}
case $arch in
    amd64) default=hypha-accelerate-base:bookworm ;;
    arm64) default=hypha-accelerate-base:bookworm-arm64 ;;
    *) echo "make-base-image: ARCH=$arch is neither amd64 nor arm64" >&2; exit 2 ;;
esac
image=${1:-$default}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if docker image inspect "$image" >/dev/null 2>&1; then
    echo "base image $image exists; nothing to do"
    exit 0
fi
if ! command -v debootstrap >/dev/null 2>&1; then
    echo "make-base-image: debootstrap not found (apt-get install -y debootstrap)" >&2
    exit 1
fi

rootfs=$(mktemp -d /tmp/hypha-base-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT

echo "debootstrap bookworm ($arch) into $rootfs (about a minute; emulated arm64: several)"
debootstrap --arch "$arch" --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$rootfs" "$mirror" >"$rootfs.log" 2>&1 || {
    echo "make-base-image: debootstrap failed, see $rootfs.log" >&2
    exit 1
}
rm -f "$rootfs.log"
# Package lists and caches are dead weight in every image built on top.
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb

if [ "$arch" = amd64 ]; then
    tar -C "$rootfs" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'CMD ["python3"]' - "$image" >/dev/null
else
    # `docker import --platform` is ignored by a 20.10 engine (the image says amd64): the
    # classic builder's --platform sets the architecture of a FROM scratch image instead.
    context=$rootfs.context
    mkdir "$context"
    trap 'rm -rf "$rootfs" "$context"' EXIT
    tar -C "$rootfs" -c . >"$context/rootfs.tar"
    printf '%s\n' 'FROM scratch' 'ADD rootfs.tar /' \
        'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        'CMD ["python3"]' >"$context/Dockerfile"
    DOCKER_BUILDKIT=0 docker build --quiet --platform "linux/$arch" --tag "$image" "$context" \
        >/dev/null 2>&1 || {
        echo "make-base-image: docker build --platform linux/$arch failed" >&2
        exit 1
    }
fi
echo "base image $image made"
