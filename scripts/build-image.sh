#!/usr/bin/env bash
# build-image.sh [OUT_TAR]: build the kvserve image (localhost/kvserve:dev) from e2e/Dockerfile
# without Docker, and write it as a docker-archive (`ctr -n k8s.io images import OUT_TAR`).
#
# 1. The base, localhost/kvserve-base:bookworm: `mmdebstrap --variant=minbase` of Debian's
#    python3 (3.11) from the mirrors the machine's own apt uses, imported into buildah.
# 2. `buildah bud` of e2e/Dockerfile (the file Docker users build) with BASE set to it, the
#    host's CPU torch wheel folder (pip's find-links) and CA bundle (pip's cert) mounted
#    read-only into the build, and buildah's layer cache: a source change rebuilds only the
#    small layers after the dependencies. Triton is left out (WITHOUT=triton): the image is
#    CPU-only.
# 3. `buildah push` to docker-archive:OUT_TAR (default $KVSERVE_K8S_CACHE/images/kvserve-dev.tar).
#
# OUT_TAR.inputs holds a hash of everything the image is made from (Dockerfile, build context,
# build arguments, base image); a matching hash skips the build. Buildah's storage lives in
# $KVSERVE_K8S_CACHE/buildah. Needs root (mmdebstrap, buildah's chroot isolation).
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE="${KVSERVE_K8S_CACHE:-$HOME/.cache/kvserve-k8s}"
OUT="${1:-$CACHE/images/kvserve-dev.tar}"
IMAGE=localhost/kvserve:dev
BASE_IMAGE=localhost/kvserve-base:bookworm
BASE_PACKAGES=(python3 python3-venv ca-certificates)
STORE="$CACHE/buildah"
DOCKERFILE="$ROOT/e2e/Dockerfile"
IGNOREFILE="$ROOT/e2e/Dockerfile.dockerignore"
PYTHON="${PYTHON:-python3}"

log() { echo "[build-image] $*" >&2; }

bah() {
    buildah --root "$STORE/root" --runroot "$STORE/run" \
        --storage-driver "${KVSERVE_BUILDAH_DRIVER:-overlay}" "$@"
}

# One `deb URI SUITE COMPONENT` line per Packages index of the machine's own bookworm sources.
debian_sources() {
    apt-get indextargets --format '$(REPO_URI) $(RELEASE) $(COMPONENT)' \
        'Identifier: Packages' "Architecture: $(dpkg --print-architecture)" |
        awk '$2 ~ /^bookworm/ {print "deb " $1 " " $2 " " $3}' | sort -u
}

base_image() {
    local sources key tmp container
    sources=$(debian_sources)
    [ -n "$sources" ] || { log "no bookworm source in the machine's apt configuration"; exit 1; }
    key=$(printf '%s\n' "$sources" "${BASE_PACKAGES[@]}" "$(mmdebstrap --version)" | sha256sum)
    if [ "$(cat "$STORE/base.inputs" 2>/dev/null)" = "$key" ] &&
        bah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
        return 0
    fi
    log "making $BASE_IMAGE with mmdebstrap (about 2 minutes)"
    tmp=$(mktemp -d "$CACHE/base.XXXXXX")
    local -a mirrors=()
    mapfile -t mirrors <<<"$sources"
    mmdebstrap --quiet --variant=minbase --include="$(IFS=,; echo "${BASE_PACKAGES[*]}")" \
        --skip=output/dev --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
        bookworm "$tmp/rootfs.tar" "${mirrors[@]}"
    container=$(bah from scratch)
    bah add --quiet "$container" "$tmp/rootfs.tar" /
    bah config --cmd '["python3"]' \
        --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$container"
    bah commit --quiet --rm "$container" "$BASE_IMAGE" >/dev/null
    echo "$key" >"$STORE/base.inputs"
}

# pip's setting NAME as the host has it (environment first, then pip's configuration files).
pip_setting() {
    local env="PIP_${1^^}"
    env=${env//-/_}
    [ -n "${!env:-}" ] && { echo "${!env}"; return 0; }
    "$PYTHON" -m pip config get "global.$1" 2>/dev/null || true
}

bud() {  # bud ARGS...: build e2e/Dockerfile with the layer cache
    bah bud --quiet --isolation chroot --network host --layers --pull=never -f "$DOCKERFILE" \
        --ignorefile "$IGNOREFILE" "${args[@]}" "${mounts[@]}" "$@" "$ROOT" >/dev/null
}

# Untagged images without children (the layers of earlier builds that no tag reaches), and
# the working containers that failed or interrupted builds leave behind in this private store.
prune() {
    local ids
    bah rm --all >/dev/null
    for _ in $(seq 100); do
        ids=$(bah images --quiet --filter dangling=true)
        [ -n "$ids" ] || return 0
        # shellcheck disable=SC2086
        bah rmi $ids >/dev/null
    done
}

# CPU-only (torch's CPU wheel): Triton, 1 GB, has nothing to run on.
args=(--build-arg "BASE=$BASE_IMAGE" --build-arg "WITHOUT=${KVSERVE_IMAGE_WITHOUT-triton}")
mounts=()
# The CPU torch wheel: mount the host's first local find-links folder, point pip at it.
for links in $(pip_setting find-links); do
    if [ -d "$links" ]; then
        mounts+=(-v "$links:/run/kvserve-build/wheels:ro")
        args+=(--build-arg PIP_FIND_LINKS=/run/kvserve-build/wheels)
        break
    fi
done
[ ${#mounts[@]} -gt 0 ] || log "no local find-links folder: torch comes from the indexes" \
    "(without PyTorch's CPU index in PIP_EXTRA_INDEX_URL, a multi-GB CUDA build)"
cert=$(pip_setting cert)
if [ -n "$cert" ] && [ -f "$cert" ]; then
    mounts+=(-v "$(readlink -f "$cert"):/run/kvserve-build/ca.crt:ro")
    args+=(--build-arg PIP_CERT=/run/kvserve-build/ca.crt)
fi
[ -n "${PIP_EXTRA_INDEX_URL:-}" ] && args+=(--build-arg "PIP_EXTRA_INDEX_URL=$PIP_EXTRA_INDEX_URL")

# What goes into the image: the Dockerfile, every file of the build context, the arguments.
inputs_hash() {
    {
        printf '%s\n' "${args[@]}"
        bah images --no-trunc --noheading --format '{{.ID}}' "$BASE_IMAGE"
        sha256sum "$DOCKERFILE" "$IGNOREFILE"
        cd "$ROOT" && { git ls-files -z -co --exclude-standard --deduplicate |
            xargs -0 sha256sum 2>/dev/null || true; }
    } | sha256sum | cut -d' ' -f1
}

KVSERVE_APT_LOCK_WAIT="${KVSERVE_APT_LOCK_WAIT:-300}" "$ROOT/scripts/apt-install.sh" \
    buildah mmdebstrap
mkdir -p "$STORE" "$(dirname "$OUT")"
exec 9>"$STORE/lock"
flock 9  # one build at a time per store
trap 'rm -rf "$CACHE"/base.?????? "$OUT.tmp"' EXIT
base_image
hash=$(inputs_hash)
if [ -f "$OUT" ] && [ "$(cat "$OUT.inputs" 2>/dev/null)" = "$hash" ]; then
    log "$OUT is up to date"
    exit 0
fi

log "building $IMAGE from e2e/Dockerfile (cold: about 5 minutes, mostly pip)"
start=$SECONDS
# The compiler stage gets a tag of its own, so that pruning keeps its layers cached.
bud --target kernel -t "$IMAGE-kernel"
bud -t "$IMAGE"
prune
rm -f "$OUT.tmp"
bah push --quiet "$IMAGE" "docker-archive:$OUT.tmp:$IMAGE"
mv "$OUT.tmp" "$OUT"
echo "$hash" >"$OUT.inputs"
log "wrote $OUT ($(du -m "$OUT" | cut -f1) MB) in $((SECONDS - start)) s"
