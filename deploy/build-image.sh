#!/usr/bin/env bash
# Build the broker image from deploy/Containerfile with podman (docs/deploy.md, "Container image").
#
#   deploy/build-image.sh                      # tag localhost/ister:latest
#   IMAGE=registry.example/ister:1 deploy/build-image.sh
#   BASE_IMAGE=docker.io/library/python:3.11-slim-bookworm deploy/build-image.sh
#
# The base is BASE_IMAGE when it is present or can be pulled. Where no registry is reachable (a closed
# network that still reaches Debian's mirror and PyPI), the script makes the base itself from Debian
# packages with mmdebstrap (python3.11 on bookworm minbase) and tags it LOCAL_BASE. The host's CA bundle is
# handed to the build as a secret, never stored in a layer, so a TLS-inspecting proxy in front of PyPI
# works as on the host.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(dirname "$here")"
IMAGE="${IMAGE:-localhost/ister:latest}"
BASE_IMAGE="${BASE_IMAGE:-docker.io/library/python:3.11-slim-bookworm}"
LOCAL_BASE="${LOCAL_BASE:-localhost/debian-python:bookworm}"
DEBIAN_MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
CA_BUNDLE="${CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
ENGINE="${ENGINE:-podman}"

need() { command -v "$1" >/dev/null 2>&1 || { echo "error: $1 not found (apt-get install -y $2)" >&2; exit 2; }; }
need "$ENGINE" "$ENGINE"

# A python3.11 base from Debian packages: what python:3.11-slim-bookworm holds, minus docs and caches.
# python3.11-venv brings ensurepip (the builder stage installs uv with it); passwd brings useradd.
make_local_base() {
    need mmdebstrap mmdebstrap
    echo "== base: $BASE_IMAGE cannot be had; making $LOCAL_BASE from Debian packages (mmdebstrap)"
    # shellcheck disable=SC2016  # "$1" is mmdebstrap's: the hook gets the chroot's path
    mmdebstrap --variant=minbase \
        --include=python3.11,python3.11-venv,ca-certificates,passwd \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*' \
        bookworm - \
        "deb $DEBIAN_MIRROR bookworm main" \
        "deb $DEBIAN_MIRROR bookworm-updates main" \
        "deb ${DEBIAN_MIRROR%/debian}/debian-security bookworm-security main" |
        "$ENGINE" import --change 'CMD ["/bin/bash"]' - "$LOCAL_BASE" >/dev/null
}

start=$(date +%s)
base="$BASE_IMAGE"
if ! "$ENGINE" image exists "$base" 2>/dev/null && ! "$ENGINE" pull -q "$base" >/dev/null 2>&1; then
    base="$LOCAL_BASE"
    "$ENGINE" image exists "$base" || make_local_base
fi
based=$(date +%s)
echo "== base $base ready in $((based - start)) s"

secret=()
[ -r "$CA_BUNDLE" ] && secret=(--secret "id=cacert,src=$CA_BUNDLE")
"$ENGINE" build --format docker ${BUILD_ISOLATION:+--isolation "$BUILD_ISOLATION"} -f "$here/Containerfile" --build-arg "BASE_IMAGE=$base" "${secret[@]}" -t "$IMAGE" "$repo"
done_at=$(date +%s)
size=$("$ENGINE" image inspect --format '{{.Size}}' "$IMAGE")
echo "== built $IMAGE on $base in $((done_at - based)) s; size $((size / 1000000)) MB"
