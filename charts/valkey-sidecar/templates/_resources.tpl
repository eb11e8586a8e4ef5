{{- /* Resources, maxmemory and the scanner's skips (README.md beside this file, "Resources"). */ -}}

{{- /* The presets of `valkey.resourcesPreset`: CPU requested, memory requested and limited alike.
No CPU limit: a limit throttles Valkey's single thread in bursts (CFS quota), which shows as
latency spikes and missed probes, and the request already reserves the CPU. */ -}}
{{- define "valkey-sidecar.presets" -}}
nano: {cpu: 100m, memory: 256Mi}
small: {cpu: 250m, memory: 1Gi}
medium: {cpu: 500m, memory: 4Gi}
large: {cpu: "1", memory: 16Gi}
xlarge: {cpu: "2", memory: 64Gi}
{{- end -}}

{{- /* Valkey's resources: `valkey.resources` when set (it replaces the preset), else the preset's;
empty for `none`. */ -}}
{{- define "valkey-sidecar.valkeyResources" -}}
{{- $v := .Values.valkey -}}
{{- if $v.resources -}}
{{- toYaml $v.resources -}}
{{- else -}}
{{- with get (include "valkey-sidecar.presets" . | fromYaml) $v.resourcesPreset -}}
requests:
  cpu: {{ .cpu }}
  memory: {{ .memory }}
limits:
  memory: {{ .memory }}
{{- end -}}
{{- end -}}
{{- end -}}

{{- /* "true" when the valkey-config init container writes `maxmemory` from the memory limit: a limit
is set and neither `valkey.maxmemory` nor a `--maxmemory` in `extraArgs` says otherwise. */ -}}
{{- define "valkey-sidecar.maxmemoryFromLimit" -}}
{{- $v := .Values.valkey -}}
{{- $limits := get (include "valkey-sidecar.valkeyResources" . | fromYaml) "limits" | default dict -}}
{{- $explicit := or $v.maxmemory (has "--maxmemory" $v.extraArgs) -}}
{{- if and (hasKey $limits "memory") (not $explicit) }}true{{ end -}}
{{- end -}}

{{- /* "true" when the Valkey pods need the valkey-config init container: the authentication file
or maxmemory from the limit. */ -}}
{{- define "valkey-sidecar.valkeyConfig" -}}
{{- if or .Values.auth.enabled (include "valkey-sidecar.maxmemoryFromLimit" .) }}true{{ end -}}
{{- end -}}

{{- /* A quantity ("512Mi", "0.5", "250m", 2) as a number of base units, for comparisons only. */ -}}
{{- define "valkey-sidecar.quantity" -}}
{{- $q := toString . -}}
{{- $factors := dict "" 1.0 "m" 0.001 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "P" 1e15 "E" 1e18 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 "Pi" 1125899906842624.0 "Ei" 1152921504606846976.0 -}}
{{- $suffix := regexReplaceAll "^[0-9.]+" $q "" -}}
{{- mulf (float64 (regexReplaceAll "[^0-9.].*$" $q "")) (get $factors $suffix) -}}
{{- end -}}

{{- /* Fails the render when a limit of `resources` (dict "what" name "resources" map) is below its
request: the apiserver would refuse the pod only when the StatefulSet creates it, out of sight. */ -}}
{{- define "valkey-sidecar.checkResources" -}}
{{- $requests := get (default dict .resources) "requests" | default dict -}}
{{- $limits := get (default dict .resources) "limits" | default dict -}}
{{- range $name, $limit := $limits }}
{{- if hasKey $requests $name }}
{{- $request := get $requests $name -}}
{{- if lt (include "valkey-sidecar.quantity" $limit | float64) (include "valkey-sidecar.quantity" $request | float64) }}
{{- fail (printf "%s: limits.%s %v is below requests.%s %v" $.what $name $limit $name $request) }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- /* Every container resources value checked once per render. */ -}}
{{- define "valkey-sidecar.checkAllResources" -}}
{{- include "valkey-sidecar.checkResources" (dict "what" "valkey.resources" "resources" (include "valkey-sidecar.valkeyResources" . | fromYaml)) -}}
{{- include "valkey-sidecar.checkResources" (dict "what" "sidecar.resources" "resources" .Values.sidecar.resources) -}}
{{- include "valkey-sidecar.checkResources" (dict "what" "sidecar.initResources" "resources" .Values.sidecar.initResources) -}}
{{- include "valkey-sidecar.checkResources" (dict "what" "metrics.exporter.resources" "resources" .Values.metrics.exporter.resources) -}}
{{- end -}}

{{- /* Checkov's skip annotations (`checkov.io/skip<n>: <check>=<why>`) from a list of "check=why"
entries; nothing for an empty list. */ -}}
{{- define "valkey-sidecar.skips" -}}
{{- range $i, $skip := . }}
checkov.io/skip{{ add1 $i }}: {{ $skip | quote }}
{{- end }}
{{- end -}}

{{- /* The skips every pod shares, for what the chart leaves to the user (dict "root" $ "images"
list of image values): digests, pull policies, user ids. */ -}}
{{- define "valkey-sidecar.imageSkips" -}}
{{- $skips := list -}}
{{- $byTag := list -}}
{{- $notAlways := list -}}
{{- range .images }}
{{- if not .digest }}{{ $byTag = append $byTag . }}{{ end }}
{{- if ne .pullPolicy "Always" }}{{ $notAlways = append $notAlways . }}{{ end }}
{{- end }}
{{- if $byTag -}}
{{- $skips = append $skips "CKV_K8S_43=by tag unless the image's digest value pins it (valkey.image.digest, sidecar.image.digest): a chart cannot know the digest in your registry or mirror" -}}
{{- end -}}
{{- if $notAlways -}}
{{- $skips = append $skips "CKV_K8S_15=IfNotPresent: a restart must not depend on the registry being reachable (an outage would keep a failed-over Valkey from coming back); pin a digest to make the cached image the one meant" -}}
{{- end -}}
{{- if not (include "valkey-sidecar.fixedIds" .root) -}}
{{- $skips = append $skips "CKV_K8S_40=the platform assigns the user from the namespace's range (restricted profile, OpenShift's restricted-v2)" -}}
{{- end -}}
{{- toJson $skips -}}
{{- end -}}

{{- /* The skips of a Valkey StatefulSet. */ -}}
{{- define "valkey-sidecar.statefulSetSkips" -}}
{{- $images := list .Values.valkey.image .Values.sidecar.image -}}
{{- if .Values.metrics.exporter.enabled }}{{ $images = append $images .Values.metrics.exporter.image }}{{ end -}}
{{- $skips := include "valkey-sidecar.imageSkips" (dict "root" . "images" $images) | fromJsonArray -}}
{{- $skips = append $skips "CKV_K8S_11=no CPU limits by default (valkey.resources and sidecar.resources can set them): CFS quota throttles Valkey's single thread and the agent's probe answers in bursts (latency spikes, missed probes, needless failovers); CPU is requested" -}}
{{- if and .Values.auth.enabled .Values.metrics.exporter.enabled -}}
{{- $skips = append $skips "CKV_K8S_35=VALKEY_AGENT_PASSWORD_SHA256 is the SHA-256 Valkey's ACL checks the agent's password against, which cannot log in; the exporter (metrics.exporter) reads the default password from REDIS_PASSWORD, in its own container only (its password file is a JSON map of addresses)" -}}
{{- else if .Values.auth.enabled -}}
{{- $skips = append $skips "CKV_K8S_35=the only Secret value in the environment is VALKEY_AGENT_PASSWORD_SHA256, the SHA-256 Valkey's ACL checks the agent's password against, which cannot log in; every password is a file" -}}
{{- end -}}
{{- include "valkey-sidecar.skips" $skips -}}
{{- end -}}

{{- /* The skips of the run-to-completion pods (the credentials Job, `helm test`). */ -}}
{{- define "valkey-sidecar.taskSkips" -}}
{{- $images := list .Values.sidecar.image -}}
{{- $skips := include "valkey-sidecar.imageSkips" (dict "root" . "images" $images) | fromJsonArray -}}
{{- $skips = append $skips "CKV_K8S_38=it talks to the Kubernetes API (the credentials Job writes the auth Secret; helm test reads the pods and the coordinator Lease): the token is what it runs on" -}}
{{- $skips = append $skips "CKV_K8S_8=a run-to-completion pod: nothing to restart while it runs for seconds" -}}
{{- $skips = append $skips "CKV_K8S_9=a run-to-completion pod: no Service sends it traffic" -}}
{{- $skips = append $skips "CKV_K8S_11=no CPU limit: a throttled Job only takes longer; CPU is requested" -}}
{{- include "valkey-sidecar.skips" $skips -}}
{{- end -}}
