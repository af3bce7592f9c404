{{/* Names, labels and the derived values every template shares. */}}

{{- define "disagg.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "disagg.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "disagg.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "disagg.selectorLabels" -}}
app.kubernetes.io/name: {{ include "disagg.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "disagg.labels" -}}
helm.sh/chart: {{ include "disagg.chart" . }}
{{ include "disagg.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: disagg
{{- end -}}

{{- define "disagg.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "disagg.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "disagg.peeringName" -}}
{{- default (include "disagg.fullname" .) .Values.peering.name -}}
{{- end -}}

{{- define "disagg.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The namespaces the operator serves: every one (cluster) or the listed ones; fails with the field name. */}}
{{- define "disagg.watchedNamespaces" -}}
{{- if eq .Values.watch.scope "namespaces" -}}
{{- if not .Values.watch.namespaces -}}
{{- fail "watch.namespaces must list at least one namespace when watch.scope is \"namespaces\"" -}}
{{- end -}}
{{- toJson .Values.watch.namespaces -}}
{{- else -}}
[]
{{- end -}}
{{- end -}}

{{/* `disagg run` arguments. The Dockerfile's ENTRYPOINT is ["disagg", "run"]. */}}
{{- define "disagg.args" -}}
{{- if eq .Values.watch.scope "cluster" }}
- --all-namespaces
{{- else }}
{{- range (include "disagg.watchedNamespaces" . | fromJsonArray) }}
- --namespace={{ . }}
{{- end }}
{{- end }}
{{- if .Values.peering.enabled }}
- --peering={{ include "disagg.peeringName" . }}
- --peering-lifetime={{ .Values.peering.lifetime }}
- --peering-priority=random
{{- else }}
- --standalone
{{- end }}
- --liveness-endpoint=http://0.0.0.0:{{ .Values.probes.port }}{{ .Values.probes.path }}
{{- if .Values.metrics.enabled }}
- --metrics-port={{ .Values.metrics.port }}
{{- end }}
{{- with .Values.prometheus.url }}
- --prometheus-url={{ . }}
{{- end }}
- --log-level={{ upper .Values.logLevel }}
{{- range .Values.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}
