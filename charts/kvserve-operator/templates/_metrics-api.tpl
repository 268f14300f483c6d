{{/*
kvserve's custom metrics API (python -m kvserve.operator.metrics_api): names, labels, and
whether it is installed. It is not when metricsAPI.enabled is false, nor when another server
(prometheus-adapter, ...) already holds an APIService of custom.metrics.k8s.io: the chart never
overwrites one it does not own (`lookup`; `helm template` sees no cluster and renders it).
*/}}
{{- define "kvserve-operator.metricsAPI.name" -}}
{{- printf "%s-metrics-api" (include "kvserve-operator.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Its own app name: the operator Deployment's selector must not match its pods. */}}
{{- define "kvserve-operator.metricsAPI.selectorLabels" -}}
app.kubernetes.io/name: kvserve-metrics-api
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvserve-operator.metricsAPI.labels" -}}
{{ include "kvserve-operator.metricsAPI.selectorLabels" . }}
app.kubernetes.io/component: metrics-api
app.kubernetes.io/part-of: kvserve-operator
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Newest first; the HPA of Kubernetes 1.20 reads v1beta1, newer ones prefer v1beta2. */}}
{{- define "kvserve-operator.metricsAPI.versions" -}}
v1beta2 v1beta1
{{- end -}}

{{/* "" when custom.metrics.k8s.io is free or ours, else which APIService holds it. */}}
{{- define "kvserve-operator.metricsAPI.takenBy" -}}
{{- $taken := list -}}
{{- range $version := splitList " " (include "kvserve-operator.metricsAPI.versions" $) -}}
{{- $existing := lookup "apiregistration.k8s.io/v1" "APIService" "" (printf "%s.custom.metrics.k8s.io" $version) -}}
{{- if $existing -}}
{{- $service := $existing.spec.service | default dict -}}
{{- if not (and (eq ($service.name | default "") (include "kvserve-operator.metricsAPI.name" $)) (eq ($service.namespace | default "") $.Release.Namespace)) -}}
{{- $taken = append $taken (printf "APIService %s (service %s/%s)" $existing.metadata.name ($service.namespace | default "-") ($service.name | default "local")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join ", " $taken -}}
{{- end -}}

{{- define "kvserve-operator.metricsAPI.active" -}}
{{- if and .Values.metricsAPI.enabled (not (include "kvserve-operator.metricsAPI.takenBy" .)) -}}true{{- end -}}
{{- end -}}
