{{- /*
Names. Every object is named after the Valkey deployment (`clusterName`, default the release):
StatefulSets and PDBs `<cluster>-<shard>`, pods `<cluster>-<shard>-<ordinal>`, Services `<cluster>`,
`<cluster>-read`, `<cluster>-headless`. 40 characters at most, so a pod's
`controller-revision-hash` label (`<cluster>-<shard>-<10 chars>`) stays within 63.
*/ -}}
{{- define "valkey-sidecar.cluster" -}}
{{- $name := default .Release.Name .Values.clusterName -}}
{{- if gt (len $name) 40 -}}
{{- fail (printf "the Valkey deployment's name %q is longer than 40 characters: set clusterName" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- /* The ConfigMap that owns the agents' Leases (SIDECAR_LEASE_OWNER). */ -}}
{{- define "valkey-sidecar.leaseOwner" -}}
{{- printf "%s-leases" (include "valkey-sidecar.cluster" .) -}}
{{- end -}}

{{- define "valkey-sidecar.serviceAccount" -}}
{{- $sa := default (printf "%s-sidecar" (include "valkey-sidecar.cluster" .)) .Values.sidecar.serviceAccount.name -}}
{{- if eq $sa "default" -}}
{{- fail "sidecar.serviceAccount.name \"default\": the agents' Role (patch pods, write Leases) would go to every pod of the namespace that names no account; give the agents an account of their own" -}}
{{- end -}}
{{- $sa -}}
{{- end -}}

{{- /* A cluster-scoped object's name from a namespaced one: cut to 63 characters with a hash of
the whole, so two long names never collide. */ -}}
{{- define "valkey-sidecar.clusterWideName" -}}
{{- if le (len .) 63 }}{{ . }}{{ else }}{{ printf "%s-%s" (trunc 54 . | trimSuffix "-") (sha256sum . | trunc 8) }}{{ end -}}
{{- end -}}

{{- /* SIDECAR_LEASE_DURATION in whole seconds, rounded up (default 15): the admission policy
bounds the Lease durations the agents may write by it. */ -}}
{{- define "valkey-sidecar.leaseSeconds" -}}
{{- $d := toString (get (default (dict) .Values.sidecar.env) "SIDECAR_LEASE_DURATION" | default "15s") -}}
{{- if regexMatch "^[0-9]+ms$" $d -}}{{ div (add (trimSuffix "ms" $d | atoi) 999) 1000 }}
{{- else if regexMatch "^[0-9]+s$" $d -}}{{ trimSuffix "s" $d | atoi }}
{{- else if regexMatch "^[0-9]+m$" $d -}}{{ mul (trimSuffix "m" $d | atoi) 60 }}
{{- else if regexMatch "^[0-9]+h$" $d -}}{{ mul (trimSuffix "h" $d | atoi) 3600 }}
{{- else -}}{{ fail (printf "sidecar.env.SIDECAR_LEASE_DURATION %q: write it as <n>ms, <n>s, <n>m or <n>h (the admission policy bounds the agents' Lease durations by it)" $d) }}
{{- end -}}
{{- end -}}

{{- /* The coordinator Lease's name (SIDECAR_LEASE_NAME, default `<cluster>-coordinator`); it goes
into the admission policy's CEL, so only a Lease name is accepted. */ -}}
{{- define "valkey-sidecar.coordinatorLease" -}}
{{- $name := default (printf "%s-coordinator" (include "valkey-sidecar.cluster" .)) (get (default (dict) .Values.sidecar.env) "SIDECAR_LEASE_NAME") -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$" $name) -}}
{{- fail (printf "sidecar.env.SIDECAR_LEASE_NAME %q is no Lease name (lower-case letters, digits, '-' and '.')" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- /* The install profile (values.yaml `profile`) and the choices it makes, each overridable by
its own value (`null`: the profile's choice). Each helper renders "true" or nothing. */ -}}
{{- define "valkey-sidecar.clusterScoped" -}}
{{- if eq .Values.profile "cluster" }}true{{ end -}}
{{- end -}}

{{- define "valkey-sidecar.profileChoice" -}}
{{- if kindIs "bool" .value }}{{ if .value }}true{{ end }}{{ else }}{{ include "valkey-sidecar.clusterScoped" .root }}{{ end -}}
{{- end -}}

{{- /* The ClusterRole that lets the agents read Nodes. */ -}}
{{- define "valkey-sidecar.readNodes" -}}
{{- include "valkey-sidecar.profileChoice" (dict "root" . "value" .Values.sidecar.readNodes) -}}
{{- end -}}

{{- /* The ValidatingAdmissionPolicies that narrow the agents' token (v1 on every supported
version). */ -}}
{{- define "valkey-sidecar.admissionPolicy" -}}
{{- include "valkey-sidecar.profileChoice" (dict "root" . "value" .Values.sidecar.admissionPolicy) -}}
{{- end -}}

{{- /* MutatingAdmissionPolicy v1 (Kubernetes >= 1.36): what the API serves, as helm learns it
from the cluster (`helm template`: from --api-versions). */ -}}
{{- define "valkey-sidecar.mutatingPolicies" -}}
{{- if .Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" }}true{{ end -}}
{{- end -}}

{{- /* The node-index policy: wanted (profile or value) and servable. */ -}}
{{- define "valkey-sidecar.nodeIndexPolicy" -}}
{{- $wanted := include "valkey-sidecar.profileChoice" (dict "root" . "value" .Values.nodeIndex.admissionPolicy) -}}
{{- if and .Values.valkey.enabled $wanted (include "valkey-sidecar.mutatingPolicies" .) }}true{{ end -}}
{{- end -}}

{{- /* The zone-pinning policy (placement.zones): cluster-scoped, so only in the cluster profile. */ -}}
{{- define "valkey-sidecar.zonePolicy" -}}
{{- if and .Values.valkey.enabled .Values.placement.zones (include "valkey-sidecar.clusterScoped" .) (include "valkey-sidecar.mutatingPolicies" .) }}true{{ end -}}
{{- end -}}

{{- /* Fixed user, group and fsGroup in the security contexts: not in the restricted profile, and
not on OpenShift, whose restricted-v2 assigns them from the namespace's range and refuses others. */ -}}
{{- define "valkey-sidecar.fixedIds" -}}
{{- if not (or (eq .Values.profile "restricted") (.Capabilities.APIVersions.Has "security.openshift.io/v1")) }}true{{ end -}}
{{- end -}}

{{- /* A security context (dict "root" $ "context" ...) without the ids the platform assigns. */ -}}
{{- define "valkey-sidecar.securityContext" -}}
{{- if include "valkey-sidecar.fixedIds" .root -}}
{{- toYaml .context -}}
{{- else -}}
{{- toYaml (omit .context "runAsUser" "runAsGroup" "fsGroup") -}}
{{- end -}}
{{- end -}}

{{- /* Labels of every object. */ -}}
{{- define "valkey-sidecar.labels" -}}
app.kubernetes.io/name: valkey
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: valkey-sidecar
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
valkey.io/cluster: {{ include "valkey-sidecar.cluster" . }}
{{- end -}}

{{- /* "true" when the coordinator rolls the chart's StatefulSets (rollout.strategy=supervised):
the sets use OnDelete. Never for shards without replicas: nothing could take over a primary. */ -}}
{{- define "valkey-sidecar.supervisedRoll" -}}
{{- if and .Values.valkey.enabled (eq .Values.rollout.strategy "supervised") (gt (int .Values.replicas) 0) -}}
true
{{- end -}}
{{- end -}}

{{- /* Labels of the pods: no chart version, so a chart upgrade alone restarts nothing. */ -}}
{{- define "valkey-sidecar.podLabels" -}}
app.kubernetes.io/name: valkey
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: valkey-sidecar
valkey.io/cluster: {{ include "valkey-sidecar.cluster" . }}
{{- end -}}

{{- /* The static labels of one shard's pods (dict "root" $ "shard" N): what StatefulSets, PDBs and
spread constraints select on. They never change over a pod's life. */ -}}
{{- define "valkey-sidecar.shardSelector" -}}
valkey.io/cluster: {{ include "valkey-sidecar.cluster" .root }}
valkey.io/shard-index: {{ .shard | quote }}
{{- end -}}

{{- /* The live role label values the agent writes: primary, replica. */ -}}
{{- define "valkey-sidecar.primaryValue" -}}
{{- index (splitList "," .Values.sidecar.labels.roleValues) 0 | trim -}}
{{- end -}}
{{- define "valkey-sidecar.replicaValue" -}}
{{- $values := splitList "," .Values.sidecar.labels.roleValues -}}
{{- if ne (len $values) 2 -}}
{{- fail "sidecar.labels.roleValues must be two values: <primary>,<replica>" -}}
{{- end -}}
{{- index $values 1 | trim -}}
{{- end -}}

{{- define "valkey-sidecar.authSecret" -}}
{{- default (printf "%s-auth" (include "valkey-sidecar.cluster" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- /* The preStop wait: the grace period less 10 s (Valkey still has to stop after the hook),
between 5 and 60 s — the rule of `valkey-sidecar inject`. */ -}}
{{- define "valkey-sidecar.prestopTimeout" -}}
{{- $grace := int .Values.terminationGracePeriodSeconds -}}
{{- if lt $grace 15 -}}
{{- fail "terminationGracePeriodSeconds below 15 leaves no time for the hand-over" -}}
{{- end -}}
{{- min 60 (max 5 (sub $grace 10)) -}}
{{- end -}}

{{- define "valkey-sidecar.prestop" -}}
preStop:
  httpGet:
    path: /prestop?timeout={{ include "valkey-sidecar.prestopTimeout" . }}s
    # A number, not the port's name: the kubelet resolves a name against the ports of the
    # container the hook is on, and the agent's port is not Valkey's.
    port: 9736
{{- end -}}

{{- /* Every image the chart renders (dict "root" $ "image" <repository, tag, digest>): the
digest wins over the tag. `global.imageRegistry` replaces the repository's registry (a first
path part with a dot or port, or `localhost`, as Docker reads it) or goes before a repository
without one (Docker Hub's `valkey/valkey`): a mirror that keeps the images' paths. The root is
required so that no image can skip the registry by accident. */ -}}
{{- define "valkey-sidecar.image" -}}
{{- if not .root -}}
{{- fail "valkey-sidecar.image takes (dict \"root\" $ \"image\" <repository, tag, digest>)" -}}
{{- end -}}
{{- $repository := .image.repository -}}
{{- with (.root.Values.global).imageRegistry -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- if and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $repository = join "/" (rest $parts) -}}
{{- end -}}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository (toString .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "valkey-sidecar.agentImage" -}}
{{- $image := deepCopy .Values.sidecar.image -}}
{{- $_ := set $image "tag" (default .Chart.AppVersion .Values.sidecar.image.tag) -}}
{{- include "valkey-sidecar.image" (dict "root" . "image" $image) -}}
{{- end -}}

{{- /* imagePullSecrets of every pod and ServiceAccount: `global.imagePullSecrets` then
`imagePullSecrets`, each a name or {name: ...}, without repeats; nothing when both are empty. */ -}}
{{- define "valkey-sidecar.imagePullSecrets" -}}
{{- $names := list -}}
{{- range concat (default (list) (.Values.global).imagePullSecrets) .Values.imagePullSecrets -}}
{{- if kindIs "string" . -}}
{{- $names = append $names . -}}
{{- else -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- end -}}
{{- $secrets := list -}}
{{- range uniq $names -}}
{{- $secrets = append $secrets (dict "name" .) -}}
{{- end -}}
{{- with $secrets }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{- /* Valkey's TLS Secret: tls.existingSecret, or the one cert-manager makes. */ -}}
{{- define "valkey-sidecar.tlsSecret" -}}
{{- if .Values.tls.certManager.enabled -}}
{{- default (printf "%s-tls" (include "valkey-sidecar.cluster" .)) .Values.tls.existingSecret -}}
{{- else -}}
{{- required "tls.existingSecret is required with tls.enabled (or tls.certManager.enabled)" .Values.tls.existingSecret -}}
{{- end -}}
{{- end -}}

{{- /* The agent's client certificate Secret (unless tls.authClients is no). */ -}}
{{- define "valkey-sidecar.agentTlsSecret" -}}
{{- if .Values.tls.certManager.enabled -}}
{{- default (printf "%s-agent-tls" (include "valkey-sidecar.cluster" .)) .Values.tls.agentExistingSecret -}}
{{- else -}}
{{- required "tls.agentExistingSecret is required unless tls.authClients is no (or with tls.certManager.enabled)" .Values.tls.agentExistingSecret -}}
{{- end -}}
{{- end -}}

{{- /* The TLS server name the agent verifies in Valkey's certificate. */ -}}
{{- define "valkey-sidecar.tlsServerName" -}}
{{- default (printf "%s.%s.svc" (include "valkey-sidecar.cluster" .) .Release.Namespace) .Values.tls.serverName -}}
{{- end -}}

{{- /* "true" when Valkey reloads its TLS files by itself: `tls-auto-reload-interval` is set and
the image is Valkey 9.1 or later (or a tag that names no version). */ -}}
{{- define "valkey-sidecar.tlsAutoReload" -}}
{{- $v := .Values -}}
{{- $tag := toString $v.valkey.image.tag -}}
{{- $versioned := regexMatch "^v?[0-9]+[.][0-9]+" $tag -}}
{{- if and $v.tls.autoReloadInterval (or (not $versioned) (semverCompare ">=9.1.0-0" $tag)) }}true{{ end -}}
{{- end -}}

{{- /* The valkey-settings container ($ as root): CONFIG SET through Valkey's Unix socket, as the
user valkey-config made for this pod; the zone from the agent's file; the TLS files read again
when they change, unless Valkey does that itself. */ -}}
{{- define "valkey-sidecar.settingsContainer" -}}
{{- $v := .Values -}}
- name: valkey-settings
  image: {{ include "valkey-sidecar.agentImage" . }}
  imagePullPolicy: {{ $v.sidecar.image.pullPolicy }}
  # A native sidecar (whatever sidecar.mode): up before Valkey, stopped after it, restarted if
  # it dies.
  restartPolicy: Always
  args:
    - valkey-settings
    - --socket
    - /run/valkey/valkey.sock
    - --zone-file
    - /run/valkey-sidecar/zone
    {{- if $v.auth.enabled }}
    - --user
    - valkey-settings
    - --password-file
    - /etc/valkey/config/settings.password
    {{- end }}
    {{- if and $v.tls.enabled (not (include "valkey-sidecar.tlsAutoReload" .)) }}
    - --tls-cert-file
    - /etc/valkey/tls/tls.crt
    - --tls-key-file
    - /etc/valkey/tls/tls.key
    - --tls-ca-cert-file
    - /etc/valkey/tls/ca.crt
    {{- end }}
  {{- with $v.sidecar.settings.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "valkey-sidecar.securityContext" (dict "root" . "context" $v.sidecar.securityContext) | nindent 4 }}
  volumeMounts:
    - name: valkey-socket
      mountPath: /run/valkey
    - name: agent-zone
      mountPath: /run/valkey-sidecar
      readOnly: true
    {{- if $v.auth.enabled }}
    - name: valkey-config
      mountPath: /etc/valkey/config
      readOnly: true
    {{- end }}
    {{- if $v.tls.enabled }}
    # The same path as in the Valkey container: the paths it sets are Valkey's.
    - name: tls
      mountPath: /etc/valkey/tls
      readOnly: true
    {{- end }}
{{- end -}}

{{- /* valkey-server's arguments (dict "root" $ "shard" N). Settings go on the command line, not in a
config file, so the pod needs no init step; secrets come in through `$(VAR)` from secretKeyRefs. */ -}}
{{- define "valkey-sidecar.valkeyArgs" -}}
{{- $v := .root.Values -}}
{{- if $v.tls.enabled }}
- --port
- "0"
- --tls-port
- {{ $v.valkey.port | quote }}
- --tls-cert-file
- /etc/valkey/tls/tls.crt
- --tls-key-file
- /etc/valkey/tls/tls.key
- --tls-ca-cert-file
- /etc/valkey/tls/ca.crt
- --tls-auth-clients
- {{ $v.tls.authClients | quote }}
- --tls-replication
- "yes"
{{- if include "valkey-sidecar.tlsAutoReload" .root }}
# Valkey re-reads its certificate, key and CA when the Secret volume changes (Valkey 9.1+; older
# tags do not know the setting and get no such argument).
- --tls-auto-reload-interval
- {{ $v.tls.autoReloadInterval | quote }}
{{- end }}
{{- if eq $v.mode "cluster" }}
- --tls-cluster
- "yes"
# A cluster client follows redirects to the address each node announces: by hostname, which the
# certificate names (`*.<name>-headless.<namespace>.svc`), a TLS client can verify it; an IP it
# could not.
- --cluster-announce-hostname
- "$(POD_NAME).{{ include "valkey-sidecar.cluster" .root }}-headless.{{ .root.Release.Namespace }}.svc"
- --cluster-preferred-endpoint-type
- hostname
{{- end }}
{{- else }}
- --port
- {{ $v.valkey.port | quote }}
{{- end }}
{{- if $v.sidecar.settings.enabled }}
# The valkey-settings container's way in: a socket in a volume only it and Valkey mount, open to
# the pod's group (the container runs as another user in the pod's fsGroup).
- --unixsocket
- /run/valkey/valkey.sock
- --unixsocketperm
- "770"
{{- end }}
- --dir
- /data
{{- if include "valkey-sidecar.valkeyConfig" .root }}
# Written by the valkey-config init container: the default user and the replication user by their
# passwords' SHA-256 only, and the replicas' login (the replication user: PSYNC, REPLCONF, PING
# only), so no password that can write reaches this container; maxmemory from the memory limit.
- --include
- /etc/valkey/config/valkey.conf
{{- end }}
{{- with $v.valkey.maxmemory }}
- --maxmemory
- {{ . | quote }}
{{- end }}
# At maxmemory: refuse writes (noeviction) or evict, as valkey.maxmemoryPolicy says.
- --maxmemory-policy
- {{ $v.valkey.maxmemoryPolicy | quote }}
{{- if $v.auth.enabled }}
# The agent's ACL user: only the commands it sends. No CONFIG SET while the valkey-settings
# container runs (it pushes the zone the agent hands it); ACLs cannot narrow CONFIG SET to one
# parameter, so without that container the agent gets it for availability-zone.
- --user
- {{ $v.auth.agentUser }}
- "on"
- "#$(VALKEY_AGENT_PASSWORD_SHA256)"
{{- if $v.auth.rotation }}
- "#$(VALKEY_NEXT_AGENT_PASSWORD_SHA256)"
{{- end }}
- resetkeys
- resetchannels
- -@all
- +ping
- +role
- +info
- +wait
- +replicaof
# The replication switchover reads the offset under its pause in one MULTI/EXEC.
- +multi
- +exec
- +discard
- +client|pause
- +client|unpause
- +client|setinfo
{{- if not $v.sidecar.settings.enabled }}
- +config|set
{{- end }}
{{- if eq $v.mode "cluster" }}
- +cluster|info
- +cluster|myid
- +cluster|myshardid
- +cluster|shards
# Which primaries this node still hears (the quorum fence).
- +cluster|nodes
- +cluster|failover
{{- if $v.formCluster }}
# Forming the cluster and re-adding replaced pods.
- +cluster|set-config-epoch
- +cluster|addslotsrange
- +cluster|meet
- +cluster|replicate
- +cluster|forget
# An empty master that remembers a cluster no pod serves any more (formation's reset).
- +cluster|reset
{{- end }}
{{- end }}
{{- range $v.auth.agentExtraRules }}
- {{ . | quote }}
{{- end }}
{{- else }}
# No password: Valkey's protected mode would refuse every connection that is not loopback.
- --protected-mode
- "no"
{{- end }}
{{- if eq $v.mode "cluster" }}
- --cluster-enabled
- "yes"
- --cluster-config-file
- /data/nodes.conf
- --cluster-node-timeout
- {{ $v.valkey.clusterNodeTimeout | quote }}
{{- end }}
{{- $minReplicas := $v.valkey.minReplicasToWrite }}
{{- if kindIs "invalid" $minReplicas }}{{ $minReplicas = min 1 $v.replicas }}{{ end }}
{{- if and (eq $v.mode "replication") (gt (int $minReplicas) 0) }}
# A primary without a recent acknowledgement from a replica refuses writes: bounds an unplanned
# failover's loss and fences an isolated or restarted-empty primary without the agent.
- --min-replicas-to-write
- {{ $minReplicas | quote }}
- --min-replicas-max-lag
- {{ $v.valkey.minReplicasMaxLag | quote }}
{{- end }}
{{- if $v.persistence.enabled }}
{{- if $v.persistence.appendonly }}
- --appendonly
- "yes"
{{- end }}
{{- else }}
# No persistence: no RDB snapshots either. They would fork (up to twice the memory) and fill an
# emptyDir that dies with the pod anyway.
- --save
- ""
- --appendonly
- "no"
{{- end }}
# A full sync starts only this long after a replica asks for one: time for the agents to fence a
# primary the kubelet restarted empty before it could stream its empty dataset to the replicas.
- --repl-diskless-sync-delay
- {{ $v.valkey.replDisklessSyncDelay | quote }}
{{- range $v.valkey.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{- /* The agent's environment (dict "root" $ "shard" N). */ -}}
{{- define "valkey-sidecar.agentEnv" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $cluster := include "valkey-sidecar.cluster" $root -}}
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
- name: POD_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: VALKEY_ADDR
  value: "127.0.0.1:{{ $v.valkey.port }}"
- name: SIDECAR_MODE
  value: {{ $v.mode }}
{{- if $v.sidecar.settings.enabled }}
# The zone goes to Valkey through the valkey-settings container, not the agent's CONFIG SET.
- name: SIDECAR_ZONE_FILE
  value: /run/valkey-sidecar/zone
{{- end }}
- name: SIDECAR_CLUSTER_NAME
  value: {{ $cluster }}
- name: SIDECAR_LEASE_OWNER
  value: {{ include "valkey-sidecar.leaseOwner" $root }}
{{- if eq $v.mode "replication" }}
- name: SIDECAR_SHARD_NAME
  value: "{{ $cluster }}-{{ .shard }}"
{{- else if $v.formCluster }}
- name: SIDECAR_CLUSTER_SHARDS
  value: {{ $v.shards | quote }}
{{- end }}
{{- if and (eq $v.mode "cluster") (not (hasKey $v.sidecar.env "SIDECAR_QUORUM_FENCE_AFTER")) }}
# A primary cut off from most primaries pauses its writes after a fifth of the node timeout:
# up before the majority can elect its replica (one timeout + 0.5 s at the earliest).
- name: SIDECAR_QUORUM_FENCE_AFTER
  value: "{{ max 100 (div (int $v.valkey.clusterNodeTimeout) 5) }}ms"
{{- end }}
{{- if include "valkey-sidecar.supervisedRoll" $root }}
- name: SIDECAR_ROLL
  value: "{{ $v.rollout.maxShardsRolling }}:{{ add1 (int $v.replicas) }}"
{{- end }}
- name: SIDECAR_HEARTBEAT_INTERVAL
  value: {{ $v.sidecar.heartbeat.interval | quote }}
- name: SIDECAR_ISOLATION_FENCE_AFTER
  value: {{ $v.sidecar.heartbeat.fenceAfter | quote }}
- name: SIDECAR_ROLE_LABEL
  value: {{ $v.sidecar.labels.role | quote }}
- name: SIDECAR_ROLE_VALUES
  value: {{ $v.sidecar.labels.roleValues | quote }}
- name: SIDECAR_SHARD_LABEL
  value: {{ $v.sidecar.labels.shard | quote }}
- name: SIDECAR_ZONE_LABEL
  value: {{ $v.sidecar.labels.zone | quote }}
- name: SIDECAR_REGION_LABEL
  value: {{ $v.sidecar.labels.region | quote }}
{{- if $v.auth.enabled }}
- name: VALKEY_USERNAME
  value: {{ $v.auth.agentUser }}
- name: VALKEY_PASSWORD_FILE
  value: /etc/valkey-sidecar/auth/password
{{- end }}
{{- if $v.tls.enabled }}
- name: VALKEY_TLS
  value: "true"
- name: VALKEY_TLS_CA_FILE
  value: /etc/valkey-sidecar/tls/ca.crt
- name: VALKEY_TLS_SERVER_NAME
  value: {{ include "valkey-sidecar.tlsServerName" $root }}
{{- if ne $v.tls.authClients "no" }}
- name: VALKEY_TLS_CERT_FILE
  value: /etc/valkey-sidecar/tls/tls.crt
- name: VALKEY_TLS_KEY_FILE
  value: /etc/valkey-sidecar/tls/tls.key
{{- end }}
{{- end }}
{{- $reserved := list "POD_NAME" "POD_UID" "POD_NAMESPACE" "NODE_NAME" "POD_IP" "VALKEY_ADDR" "VALKEY_USERNAME" "VALKEY_PASSWORD_FILE" "SIDECAR_MODE" "SIDECAR_CLUSTER_NAME" "SIDECAR_LEASE_OWNER" "SIDECAR_SHARD_NAME" "SIDECAR_CLUSTER_SHARDS" "SIDECAR_ROLL" "SIDECAR_HEARTBEAT_INTERVAL" "SIDECAR_ISOLATION_FENCE_AFTER" "SIDECAR_ROLE_LABEL" "SIDECAR_ROLE_VALUES" "SIDECAR_SHARD_LABEL" "SIDECAR_ZONE_LABEL" "SIDECAR_REGION_LABEL" }}
{{- range $name, $value := $v.sidecar.env }}
{{- if or (has $name $reserved) (hasPrefix "VALKEY_TLS" $name) }}
{{- fail (printf "sidecar.env.%s: the chart sets it from its own values" $name) }}
{{- end }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end -}}

{{- /* Valkey's probes, all answered by the agent from its cached state (the same as
`valkey-sidecar inject` adds): a blocked Valkey never stalls a kubelet probe. */ -}}
{{- define "valkey-sidecar.valkeyProbes" -}}
# Two minutes for Valkey's first answer (loading counts as one).
startupProbe:
  httpGet:
    path: /startupz
    port: 9736
  periodSeconds: 2
  failureThreshold: 60
# /livez itself waits out SIDECAR_LIVENESS_WINDOW (30 s) of silence: restarts stay rare. A late
# answer from its cache means a starved node, not a dead Valkey: 5 s before a failure counts.
livenessProbe:
  httpGet:
    path: /livez
    port: 9736
  periodSeconds: 5
  timeoutSeconds: 5
  failureThreshold: 3
# Cheap, so frequent: readiness (and so the PodDisruptionBudgets) follows sync closely.
readinessProbe:
  httpGet:
    path: /readyz
    port: 9736
  periodSeconds: 2
  failureThreshold: 2
{{- end -}}

{{- /* The agent's container (dict "root" $ "shard" N). */ -}}
{{- define "valkey-sidecar.agentContainer" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
- name: valkey-sidecar
  image: {{ include "valkey-sidecar.agentImage" $root }}
  imagePullPolicy: {{ $v.sidecar.image.pullPolicy }}
  {{- if eq $v.sidecar.mode "native" }}
  # A native sidecar: started before Valkey, stopped only after Valkey has exited, so it answers
  # Valkey's preStop wait for its whole length.
  restartPolicy: Always
  {{- end }}
  ports:
    - name: probe
      containerPort: 9736
    - name: heartbeat
      containerPort: 9736
      protocol: UDP
  env:
    {{- include "valkey-sidecar.agentEnv" . | trim | nindent 4 }}
  {{- if eq $v.sidecar.mode "native" }}
  # Valkey starts once the agent listens (Valkey's own probes are on this port). Not /startupz:
  # that needs Valkey, which starts only after this probe passes.
  startupProbe:
    tcpSocket:
      port: 9736
    periodSeconds: 1
    failureThreshold: 30
  {{- else }}
  # A classic sidecar gets SIGTERM as soon as the pod is deleted: the same wait keeps it serving
  # until the hand-over is done.
  lifecycle:
    {{- include "valkey-sidecar.prestop" $root | nindent 4 }}
  # A regular container, so probed as one: restarted only when its own HTTP server stops
  # answering (its metrics, whatever Valkey's state) for a minute.
  livenessProbe:
    httpGet:
      path: /metrics
      port: 9736
    periodSeconds: 10
    timeoutSeconds: 5
    failureThreshold: 6
  readinessProbe:
    tcpSocket:
      port: 9736
    periodSeconds: 10
  {{- end }}
  {{- with $v.sidecar.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- include "valkey-sidecar.securityContext" (dict "root" $root "context" $v.sidecar.securityContext) | nindent 4 }}
  volumeMounts:
    - name: kube-api-access
      mountPath: /var/run/secrets/kubernetes.io/serviceaccount
      readOnly: true
    {{- if $v.auth.enabled }}
    - name: agent-auth
      mountPath: /etc/valkey-sidecar/auth
      readOnly: true
    {{- end }}
    {{- if $v.tls.enabled }}
    - name: agent-tls
      mountPath: /etc/valkey-sidecar/tls
      readOnly: true
    {{- end }}
    {{- if $v.sidecar.settings.enabled }}
    # Where it writes the zone for the valkey-settings container.
    - name: agent-zone
      mountPath: /run/valkey-sidecar
    {{- end }}
{{- end -}}

{{- /* podAntiAffinity terms from `spread` (dict "root" $ "shard" N): a topology key whose
maxPerDomain is 1 is an anti-affinity on the shard's static labels; `spread.clusterNode` prefers
nodes without any pod of this Valkey deployment. */ -}}
{{- define "valkey-sidecar.antiAffinity" -}}
{{- $root := .root -}}
{{- $shard := include "valkey-sidecar.shardSelector" . -}}
{{- $required := list -}}
{{- $preferred := list -}}
{{- range $key := list "node" "zone" "region" -}}
{{- $s := get $root.Values.spread $key -}}
{{- if and (ne $s.mode "Disabled") (eq (int $s.maxPerDomain) 1) -}}
{{- $term := dict "topologyKey" $s.topologyKey "labelSelector" (dict "matchLabels" (fromYaml $shard)) -}}
{{- if eq $s.mode "Required" -}}
{{- $required = append $required $term -}}
{{- else -}}
{{- $preferred = append $preferred (dict "weight" 100 "podAffinityTerm" $term) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if eq $root.Values.spread.clusterNode "Preferred" -}}
{{- $all := dict "valkey.io/cluster" (include "valkey-sidecar.cluster" $root) -}}
{{- $term := dict "topologyKey" $root.Values.spread.node.topologyKey "labelSelector" (dict "matchLabels" $all) -}}
{{- $preferred = append $preferred (dict "weight" 50 "podAffinityTerm" $term) -}}
{{- end -}}
{{- if eq $root.Values.spread.primaries "Preferred" -}}
{{- /* The StatefulSet's own pod index (every supported version sets it), not node-index, which
only the admission policy adds where Kubernetes has it. */ -}}
{{- $intended := dict "valkey.io/cluster" (include "valkey-sidecar.cluster" $root) "apps.kubernetes.io/pod-index" "0" -}}
{{- $term := dict "topologyKey" $root.Values.spread.node.topologyKey "labelSelector" (dict "matchLabels" $intended) -}}
{{- $preferred = append $preferred (dict "weight" 80 "podAffinityTerm" $term) -}}
{{- end -}}
{{- if $required }}
requiredDuringSchedulingIgnoredDuringExecution:
  {{- toYaml $required | nindent 2 }}
{{- end }}
{{- if $preferred }}
preferredDuringSchedulingIgnoredDuringExecution:
  {{- toYaml $preferred | nindent 2 }}
{{- end }}
{{- end -}}

{{- /* topologySpreadConstraints from `spread` for keys whose maxPerDomain is above 1: maxSkew is
maxPerDomain; Required adds minDomains = the shard's pod count, which makes the scheduler count
the emptiest domain as 0 and so turns maxSkew into a hard cap per domain. */ -}}
{{- define "valkey-sidecar.spreadConstraints" -}}
{{- $root := .root -}}
{{- $shard := include "valkey-sidecar.shardSelector" . -}}
{{- $pods := add1 (int $root.Values.replicas) -}}
{{- range $key := list "node" "zone" "region" -}}
{{- $s := get $root.Values.spread $key -}}
{{- if and (ne $s.mode "Disabled") (gt (int $s.maxPerDomain) 1) }}
- topologyKey: {{ $s.topologyKey }}
  maxSkew: {{ $s.maxPerDomain }}
  {{- if eq $s.mode "Required" }}
  whenUnsatisfiable: DoNotSchedule
  minDomains: {{ $pods }}
  {{- else }}
  whenUnsatisfiable: ScheduleAnyway
  {{- end }}
  labelSelector:
    matchLabels:
      {{- $shard | nindent 6 }}
{{- end -}}
{{- end -}}
{{- end -}}


{{- /* The credentials Job's pod template (dict "root" $ "name" ... "secret" ... "owner" ...). Not
labelled valkey.io/cluster: the agents and `check` select the Valkey pods by it. */ -}}
{{- define "valkey-sidecar.credentialsPod" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $a := $v.auth -}}
metadata:
  labels:
    app.kubernetes.io/name: valkey-sidecar-credentials
    app.kubernetes.io/instance: {{ $root.Release.Name }}
    app.kubernetes.io/part-of: valkey-sidecar
spec:
  serviceAccountName: {{ .name }}
  automountServiceAccountToken: true
  restartPolicy: Never
  enableServiceLinks: false
  securityContext:
    {{- include "valkey-sidecar.securityContext" (dict "root" $root "context" (omit $v.podSecurityContext "fsGroup" "fsGroupChangePolicy")) | nindent 4 }}
  {{- with include "valkey-sidecar.imagePullSecrets" $root }}
  imagePullSecrets:
    {{- . | nindent 4 }}
  {{- end }}
  {{- with $v.priorityClassName }}
  # The Valkey pods wait for this Job's Secret: it must not stay Pending behind them.
  priorityClassName: {{ . }}
  {{- end }}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: credentials
      image: {{ include "valkey-sidecar.agentImage" $root }}
      imagePullPolicy: {{ $v.sidecar.image.pullPolicy }}
      args:
        - credentials
        - --secret
        - {{ .secret }}
        - --owner
        - {{ .owner }}
        - --rotation
        - {{ $a.rotation | quote }}
        - --label
        - app.kubernetes.io/name=valkey
        - --label
        - app.kubernetes.io/instance={{ $root.Release.Name }}
        - --label
        - app.kubernetes.io/part-of=valkey-sidecar
        - --default-key
        - {{ $a.defaultPasswordKey }}
        - --agent-key
        - {{ $a.agentPasswordKey }}
        - --agent-hash-key
        - {{ $a.agentPasswordHashKey }}
        - --next-default-key
        - {{ $a.nextDefaultPasswordKey }}
        - --next-agent-key
        - {{ $a.nextAgentPasswordKey }}
        - --next-agent-hash-key
        - {{ $a.nextAgentPasswordHashKey }}
      env:
        - name: POD_NAMESPACE
          valueFrom:
            fieldRef:
              fieldPath: metadata.namespace
      # What the Job's pod printed last is its status message when it fails (`kubectl describe`).
      terminationMessagePolicy: FallbackToLogsOnError
      resources:
        requests:
          cpu: 10m
          memory: 16Mi
        limits:
          memory: 64Mi
      securityContext:
        {{- include "valkey-sidecar.securityContext" (dict "root" $root "context" $v.sidecar.securityContext) | nindent 8 }}
{{- end -}}

{{- /* The apiserver's addresses for the NetworkPolicies' egress, as peers: `networkPolicy.apiServer.to`
when set, else nothing (any address). The chart does not look them up: a render must not depend on
the cluster (`helm template` under Argo CD or Flux cannot look), so NOTES says how to set them. */ -}}
{{- define "valkey-sidecar.apiServerPeers" -}}
{{- with .Values.networkPolicy.apiServer.to -}}
{{- toYaml . -}}
{{- end -}}
{{- end -}}

{{- /* The apiserver's ports for the same rule. */ -}}
{{- define "valkey-sidecar.apiServerPorts" -}}
{{- range (.Values.networkPolicy.apiServer.ports | uniq) }}
- port: {{ int . }}
  protocol: TCP
{{- end -}}
{{- end -}}

{{- /* Refuses, on `helm upgrade`, what the agents cannot carry out: a changed shard count (they never
reshard) and a Valkey downgrade across a major version (a newer major's RDB cannot be loaded by an
older one), unless rollout.allowDowngrade. Compared with what the release's ConfigMap recorded at
the last install or upgrade; a render without a cluster (helm template, Argo CD) has none and is
not checked. */ -}}
{{- define "valkey-sidecar.upgradeGuards" -}}
{{- $old := lookup "v1" "ConfigMap" .Release.Namespace (include "valkey-sidecar.leaseOwner" .) -}}
{{- $data := (($old | default dict).data | default dict) -}}
{{- if and .Values.valkey.enabled $data.shards (ne $data.shards (toString .Values.shards)) -}}
{{- fail (printf "shards: this release runs %s shards and the agents never reshard, so shards=%v is refused (it would add empty shards or drop shards with their data). To grow, install a second release with more shards and move the keys to it (README, \"Upgrading\")." $data.shards .Values.shards) -}}
{{- end -}}
{{- $was := regexFind "^[0-9]+" (toString ($data.valkeyVersion | default "")) -}}
{{- $now := regexFind "^[0-9]+" (toString .Values.valkey.image.tag) -}}
{{- if and .Values.valkey.enabled $was $now (lt (atoi $now) (atoi $was)) (not .Values.rollout.allowDowngrade) -}}
{{- fail (printf "valkey.image.tag: %s would downgrade Valkey %s to an older major version, whose replicas cannot load the newer primaries' data; set rollout.allowDowngrade=true only to go back to a version this release never left (its data is still in the older format)" .Values.valkey.image.tag $data.valkeyVersion) -}}
{{- end -}}
{{- end -}}
