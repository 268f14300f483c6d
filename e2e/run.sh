#!/usr/bin/env bash
# The end-to-end scenarios (e2e/scenarios.py) on any cluster kubectl points at (kind included):
# build the image with Docker, load it into kind if asked, then run every scenario. CI runs the
# same scenarios on the project's own node with `make e2e`; see e2e/README.md.
#
#   e2e/run.sh                          build the image, run every scenario
#   E2E_BUILD=0 e2e/run.sh              reuse an image the nodes already have ($E2E_IMAGE)
#   e2e/run.sh --only demo-serves ...   arguments go to e2e/scenarios.py
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${E2E_IMAGE:-kvserve:dev}"
KIND_CLUSTER="${E2E_KIND_CLUSTER:-}"      # set to load the image into this kind cluster
PYTHON="${PYTHON:-python3}"
# kind's pod and Service networks are not routable from the host: port-forward there.
ACCESS="${E2E_ACCESS:-$([ -n "$KIND_CLUSTER" ] && echo port-forward || echo clusterip)}"

log() { echo "[e2e] $*" >&2; }

if [ "${E2E_BUILD:-1}" = 1 ]; then
    log "building $IMAGE"
    docker build -f e2e/Dockerfile ${PIP_EXTRA_INDEX_URL:+--build-arg PIP_EXTRA_INDEX_URL="$PIP_EXTRA_INDEX_URL"} -t "$IMAGE" .
    if [ -n "$KIND_CLUSTER" ]; then kind load docker-image "$IMAGE" --name "$KIND_CLUSTER"; fi
fi

log "running the scenarios (image $IMAGE, access $ACCESS)"
exec "$PYTHON" e2e/scenarios.py --image "$IMAGE" --access "$ACCESS" \
    ${E2E_NAMESPACE:+--namespace "$E2E_NAMESPACE"} \
    ${E2E_OPERATOR_NAMESPACE:+--operator-namespace "$E2E_OPERATOR_NAMESPACE"} "$@"
