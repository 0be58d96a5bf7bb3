{{/* Names and labels. */}}
{{- define "a2a-gateway.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "a2a-gateway.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "a2a-gateway.selectorLabels" -}}
app.kubernetes.io/name: {{ include "a2a-gateway.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "a2a-gateway.labels" -}}
{{ include "a2a-gateway.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "a2a-gateway.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "a2a-gateway.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "a2a-gateway.tlsSecretName" -}}
{{- default (printf "%s-tls" (include "a2a-gateway.fullname" .)) .Values.tls.secretName }}
{{- end }}

{{/*
Values that render but cannot run, refused here (fail closed) rather than by a pod that
crash-loops or, worse, runs and loses its audit log.
*/}}
{{- define "a2a-gateway.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.postgres.dsn) }}
{{- fail "replicaCount > 1 needs postgres.dsn: replicas of one agent id share their audit chain, idempotency keys and replay window only through PostgreSQL" }}
{{- end }}
{{- if and (not .Values.postgres.dsn) (not .Values.state.existingClaim) }}
{{- fail "without postgres.dsn the audit log is a SQLite file: set state.existingClaim so it outlives the pod" }}
{{- end }}
{{- end }}

{{/* agent.toml: the chart's settings, then agent.extraConfig. Strings are written as JSON
strings, which TOML reads the same. */}}
{{- define "a2a-gateway.agentToml" -}}
id = {{ .Values.agent.id | toJson }}
listen = "0.0.0.0:{{ .Values.agent.grpcPort }}"
policy = "/etc/a2a-gateway/policy/policy.toml"
{{- if .Values.postgres.dsn }}
audit_db = {{ .Values.postgres.dsn | toJson }}
state_db = {{ .Values.postgres.dsn | toJson }}
{{- else }}
audit_db = "/var/lib/a2a-gateway/audit.sqlite"
{{- end }}
state_dir = "/var/lib/a2a-gateway"
modules = {{ .Values.agent.modules | toJson }}
{{- with .Values.agent.extraConfig }}

{{ . | trim }}
{{- end }}

[tls]
{{- if eq .Values.tls.source "spiffe-csi" }}
source = "workload-api"
socket = {{ printf "unix:///spiffe-workload-api/%s" .Values.tls.spiffeCsi.socketFile | toJson }}
{{- else }}
ca = "/etc/a2a-gateway/pki/ca.crt"
cert = "/etc/a2a-gateway/pki/tls.crt"
key = "/etc/a2a-gateway/pki/tls.key"
{{- end }}

[metrics]
listen = "0.0.0.0:{{ .Values.agent.metricsPort }}"
allow_remote = true   # the kubelet probes the pod's IP; the NetworkPolicy limits who scrapes

[a2a]
grpc_address = {{ default (printf "%s:%d" (include "a2a-gateway.fullname" .) (int .Values.agent.grpcPort)) .Values.agent.advertisedAddress | toJson }}
{{- with .Values.agent.a2aConfig }}
{{ . | trim }}
{{- end }}
{{- end }}
