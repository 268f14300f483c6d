{{- define "kvserve-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "kvserve-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvserve-operator.labels" -}}
{{ include "kvserve-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "kvserve-operator.serviceAccountName" -}}
{{- default (include "kvserve-operator.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/*
Exactly the verbs the operator uses. kopf lists and watches every kind it handles and patches
its annotations on LLMDeployments; the operator reads LLMDeployments and Deployments, lists
their pods (ModelLoaded) and InferencePools, sets a pod's adapters readiness gate (pods/status),
writes children with server-side apply (create +
patch) and the status with a patch, deletes only an HPA or InferencePool that a spec stops
asking for, and posts Events. Everything else goes with its LLMDeployment
through owner references and the garbage collector.
*/}}
{{- define "kvserve-operator.rules" -}}
- apiGroups: [kvserve.io]
  resources: [llmdeployments]
  verbs: [get, list, watch, patch]
- apiGroups: [kvserve.io]
  resources: [llmdeployments/status]
  verbs: [patch]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch, create, patch]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [list, watch, create, patch]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [monitoring.coreos.com]
  resources: [podmonitors]
  verbs: [list, watch, create, patch]
- apiGroups: [inference.networking.k8s.io]
  resources: [inferencepools]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [llm-d.ai, inference.networking.x-k8s.io]
  resources: [inferencemodelrewrites]
  verbs: [list, create, patch, delete]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [pods/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
{{- end -}}

{{- define "kvserve-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
