{{- /* Monitoring (values `metrics`): what more than one template needs. */ -}}

{{- /* Whether a PodMonitor or ServiceMonitor scrapes the pods: then the NetworkPolicy lets
`metrics.scrapers` in. */ -}}
{{- define "valkey-sidecar.scraped" -}}
{{- if or .Values.metrics.podMonitor.enabled .Values.metrics.serviceMonitor.enabled }}true{{ end -}}
{{- end -}}

{{- /* The pod labels the alert rules and the dashboard group by, copied onto every series by the
monitors (as `valkey_io_cluster`, `valkey_io_shard_index`). */ -}}
{{- define "valkey-sidecar.podTargetLabels" -}}
- valkey.io/cluster
- valkey.io/shard-index
{{- end -}}

{{- /* The Valkey exporter beside Valkey (dict "root" $ "shard" N), `metrics.exporter`. */ -}}
{{- define "valkey-sidecar.exporterContainer" -}}
{{- $v := .root.Values -}}
{{- $e := $v.metrics.exporter -}}
- name: exporter
  image: {{ include "valkey-sidecar.image" (dict "root" .root "image" $e.image) }}
  imagePullPolicy: {{ $e.image.pullPolicy }}
  env:
    # Valkey in the same pod, over loopback.
    - name: REDIS_ADDR
      value: {{ if $v.tls.enabled }}rediss{{ else }}redis{{ end }}://localhost:{{ $v.valkey.port }}
    {{- if $v.auth.enabled }}
    # The default user: the agent's ACL user may run only what the agent sends.
    - name: REDIS_PASSWORD
      valueFrom:
        secretKeyRef:
          name: {{ include "valkey-sidecar.authSecret" .root }}
          key: {{ $v.auth.defaultPasswordKey }}
    {{- end }}
    {{- if $v.tls.enabled }}
    # Valkey's certificate names its Service, not localhost; over the pod's own loopback nobody
    # else is on the path, so the name is not checked.
    - name: REDIS_EXPORTER_SKIP_TLS_VERIFICATION
      value: "true"
    {{- if ne $v.tls.authClients "no" }}
    # The agent's client certificate (Valkey asks clients for one).
    - name: REDIS_EXPORTER_TLS_CLIENT_CERT_FILE
      value: /etc/redis_exporter/tls/tls.crt
    - name: REDIS_EXPORTER_TLS_CLIENT_KEY_FILE
      value: /etc/redis_exporter/tls/tls.key
    {{- end }}
    {{- end }}
  ports:
    - name: exporter
      containerPort: 9121
  # The exporter's own `/health` (it answers while Valkey is down too: a restart would not help).
  livenessProbe:
    httpGet:
      path: /health
      port: 9121
    periodSeconds: 10
    failureThreshold: 3
  readinessProbe:
    httpGet:
      path: /health
      port: 9121
    periodSeconds: 10
  {{- with $e.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "valkey-sidecar.securityContext" (dict "root" .root "context" $e.securityContext) | nindent 4 }}
  {{- if and $v.tls.enabled (ne $v.tls.authClients "no") }}
  volumeMounts:
    - name: agent-tls
      mountPath: /etc/redis_exporter/tls
      readOnly: true
  {{- end }}
{{- end -}}
