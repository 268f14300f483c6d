#!/usr/bin/env bash
# End-to-end on a real cluster (kind, or any cluster kubectl points at): real pods, Service
# traffic through the OpenAI SDK, rollouts that cut no stream, HPA scale-up under load.
# Not run in CI; see e2e/README.md for prerequisites.
#
#   e2e/run.sh              build the image, install everything, run every scenario
#   E2E_BUILD=0 e2e/run.sh  reuse an image already in the cluster ($E2E_IMAGE)
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE="${E2E_IMAGE:-kvserve:dev}"
KIND_CLUSTER="${E2E_KIND_CLUSTER:-}"      # set to load the image into this kind cluster
NAMESPACE="${E2E_NAMESPACE:-kvserve-e2e}"
OPERATOR_NS="${E2E_OPERATOR_NAMESPACE:-kvserve-system}"
MONITORING_NS="${E2E_MONITORING_NAMESPACE:-monitoring}"
PYTHON="${PYTHON:-python3}"

log() { echo "[e2e] $*" >&2; }

if [ "${E2E_BUILD:-1}" = 1 ]; then
    log "building $IMAGE"
    docker build -f e2e/Dockerfile ${PIP_EXTRA_INDEX_URL:+--build-arg PIP_EXTRA_INDEX_URL="$PIP_EXTRA_INDEX_URL"} -t "$IMAGE" .
    if [ -n "$KIND_CLUSTER" ]; then kind load docker-image "$IMAGE" --name "$KIND_CLUSTER"; fi
fi

if [ "${E2E_MONITORING:-1}" = 1 ]; then
    log "installing Prometheus (kube-prometheus-stack) and prometheus-adapter into $MONITORING_NS"
    helm upgrade --install prom prometheus-community/kube-prometheus-stack \
        --namespace "$MONITORING_NS" --create-namespace --wait \
        --set grafana.enabled=false --set alertmanager.enabled=false \
        --set prometheus.prometheusSpec.podMonitorSelectorNilUsesHelmValues=false \
        --set prometheus.prometheusSpec.scrapeInterval=5s
fi

repo="${IMAGE%:*}"; tag="${IMAGE##*:}"
log "installing the operator chart ($IMAGE) into $OPERATOR_NS"
helm upgrade --install kvs charts/kvserve-operator --namespace "$OPERATOR_NS" --create-namespace \
    --set image.repository="$repo" --set image.tag="$tag" --set image.pullPolicy=IfNotPresent \
    --set resyncSeconds=30 \
    --set metricsAdapter.enabled=true --set metricsAdapter.namespace="$MONITORING_NS" --wait

if [ "${E2E_MONITORING:-1}" = 1 ]; then
    helm upgrade --install adapter prometheus-community/prometheus-adapter \
        --namespace "$MONITORING_NS" --wait \
        --set prometheus.url="http://prom-kube-prometheus-stack-prometheus.$MONITORING_NS.svc" \
        --set prometheus.port=9090 --set rules.existing=kvserve-adapter-rules
fi

kubectl create namespace "$NAMESPACE" --dry-run=client -o yaml | kubectl apply -f -
log "running the scenarios in $NAMESPACE"
"$PYTHON" e2e/scenarios.py --namespace "$NAMESPACE" --operator-namespace "$OPERATOR_NS" \
    --image "$IMAGE" "$@"
