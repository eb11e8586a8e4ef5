{{- define "valkey-sidecar.cluster" -}}
{{- default .Release.Name .Values.clusterName | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "valkey-sidecar.serviceAccount" -}}
{{- default (printf "%s-sidecar" (include "valkey-sidecar.cluster" .)) .Values.sidecar.serviceAccount.name -}}
{{- end -}}

{{- define "valkey-sidecar.labels" -}}
app.kubernetes.io/name: valkey
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
valkey.io/cluster: {{ include "valkey-sidecar.cluster" . }}
{{- end -}}
