{{/* Names, labels and the service account, shared by every template. */}}
{{- define "cohabit.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cohabit.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "cohabit.selector" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "cohabit.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "cohabit.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "cohabit.image" -}}
{{ printf "%s:%s" .Values.image.repository .Values.image.tag }}
{{- end -}}

{{/* The device plugin needs the kubelet's socket directory, hence privilege. The agent
publishes per-GPU GiB budgets, or one unit per GPU with fractional placement off. */}}
{{- define "cohabit.devicePlugin" -}}
{{- if and (eq .Values.mode "standalone") (eq .Values.agent.budgetBackend "device-plugin") (not (include "cohabit.dra" .)) -}}true{{- end -}}
{{- end -}}

{{/* placement.backend dra: the agent publishes ResourceSlices and serves the DRA kubelet
plugin (privileged: the kubelet's plugin directories and the CDI spec directory). */}}
{{- define "cohabit.dra" -}}
{{- if and (eq .Values.mode "standalone") (eq (.Values.placement.backend | default "extendedResources") "dra") -}}true{{- end -}}
{{- end -}}

{{/* The user to run as: the chart's runAsUser, except on OpenShift, whose restricted-v2
SCC assigns one from the namespace's range and refuses a fixed one outside it. Empty: none. */}}
{{- define "cohabit.runAsUser" -}}
{{- if and .Values.runAsUser (not (.Capabilities.APIVersions.Has "security.openshift.io/v1")) -}}
{{ .Values.runAsUser }}
{{- end -}}
{{- end -}}

{{/* Labels of the nodes cohabit may place on, as a label selector (k=v,k2=v2). */}}
{{- define "cohabit.nodeSelector" -}}
{{- $terms := list -}}
{{- range $key, $value := .Values.placement.nodeSelector -}}
{{- $terms = append $terms (printf "%s=%s" $key $value) -}}
{{- end -}}
{{- join "," $terms -}}
{{- end -}}

{{- define "cohabit.restrictedSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
{{- with include "cohabit.runAsUser" . }}
runAsUser: {{ . }}
{{- end }}
capabilities:
  drop: [ALL]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Where Prometheus finds the API's metrics, for scrape configs that discover targets by
these annotations (the pod's and the Service's alike). */}}
{{- define "cohabit.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .Values.api.port | quote }}
prometheus.io/path: /metrics
{{- end -}}
