{{/* Chart name, truncated to the DNS label limit. */}}
{{- define "gpuheal.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: <release>-<chart> unless the release name already contains the chart name. */}}
{{- define "gpuheal.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "gpuheal.bridgeFullname" -}}
{{- printf "%s-slurm-bridge" (include "gpuheal.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuheal.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "gpuheal.labels" -}}
helm.sh/chart: {{ include "gpuheal.chart" . }}
app.kubernetes.io/name: {{ include "gpuheal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuheal
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "gpuheal.operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuheal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "gpuheal.bridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuheal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: slurm-bridge
{{- end -}}

{{/* The node Jobs' namespace: nodeJobs.namespace, else <release>-node-jobs. */}}
{{- define "gpuheal.nodeJobsNamespace" -}}
{{- default (printf "%s-node-jobs" .Release.Name) .Values.nodeJobs.namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
Pod Security labels of the namespaces the chart creates for its privileged pods (the agent's,
the node Jobs'): they need `privileged`, said for all three modes, so that a cluster-wide
default (an AdmissionConfiguration's warn/audit `restricted`) neither warns on nor flags every
pod the chart runs there by design; the release namespace, with the operator and the bridge,
is the one to hold `restricted` (docs/install.md).
*/}}
{{- define "gpuheal.privilegedNamespaceLabels" -}}
pod-security.kubernetes.io/enforce: privileged
pod-security.kubernetes.io/warn: privileged
pod-security.kubernetes.io/audit: privileged
{{- end -}}

{{/* The operator's user name at admission (request.userInfo.username). */}}
{{- define "gpuheal.operatorUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "gpuheal.serviceAccountName" .) -}}
{{- end -}}

{{- define "gpuheal.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpuheal.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* image reference: repository@digest, or repository:tag (tag defaults to appVersion). */}}
{{- /*
An image reference: (list <image values> $ [<their values path>]). requireDigests refuses to
render one without a digest (a tag can be moved to other content), naming the value to set.
*/}}
{{- define "gpuheal.image" -}}
{{- $img := index . 0 -}}
{{- $root := index . 1 -}}
{{- if and $root.Values.requireDigests (not $img.digest) -}}
{{- $where := ternary (index . 2) "an image" (gt (len .) 2) -}}
{{- fail (printf "requireDigests: the image %s:%s is not pinned by digest: set %s.digest (sha256:...)" $img.repository (default $root.Chart.AppVersion $img.tag) $where) -}}
{{- end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- printf "%s:%s" $img.repository (default $root.Chart.AppVersion $img.tag) -}}
{{- end -}}
{{- end -}}

{{/* Name of the Secret with the bridge token ("" when the operator has no bridge). */}}
{{- define "gpuheal.bridgeTokenSecret" -}}
{{- if .Values.bridge.token.existingSecret -}}
{{- .Values.bridge.token.existingSecret -}}
{{- else if .Values.bridge.token.value -}}
{{- printf "%s-bridge-token" (include "gpuheal.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* What rolls the operator and bridge pods when the chart-managed bridge token
(bridge.token.value) changes: a random value, new only when the token is. Not a hash of the
token: a pod's annotations are read by many more than its Secrets (the `view` role), and a hash
of a guessable token gives the token away. The value lives in the token Secret's annotation;
an upgrade that finds the Secret holding the same token keeps it. Without a cluster to look at
(`helm template`, a client-side dry run) every render makes a new one: the pods roll at each
apply there (use bridge.token.existingSecret, as production should). Made once per render. */}}
{{- define "gpuheal.bridgeTokenRollout" -}}
{{- if not (hasKey .Values.bridge.token "rollout_") -}}
{{- $rollout := "" -}}
{{- $live := lookup "v1" "Secret" .Release.Namespace (include "gpuheal.bridgeTokenSecret" .) -}}
{{- if and $live (eq (index ($live.data | default dict) .Values.bridge.token.key | default "") (.Values.bridge.token.value | b64enc)) -}}
{{- $rollout = index ($live.metadata.annotations | default dict) "gpuheal.io/token-rollout" | default "" -}}
{{- end -}}
{{- $_ := set .Values.bridge.token "rollout_" ($rollout | default (randAlphaNum 24)) -}}
{{- end -}}
{{- .Values.bridge.token.rollout_ -}}
{{- end -}}

{{/* URL the operator calls the bridge at ("" = no Slurm). */}}
{{- define "gpuheal.bridgeURL" -}}
{{- if .Values.bridge.url -}}
{{- .Values.bridge.url -}}
{{- else if .Values.slurmBridge.enabled -}}
{{- printf "%s://%s.%s.svc:%d" (ternary "https" "http" (ne .Values.slurmBridge.tlsSecret "")) (include "gpuheal.bridgeFullname" .) .Release.Namespace (int .Values.slurmBridge.port) -}}
{{- end -}}
{{- end -}}

{{/* Comma-separated list of the enabled detection sources. */}}
{{- define "gpuheal.sources" -}}
{{- $s := list -}}
{{- range $k := list "conditions" "events" "dcgm" -}}
{{- if index $.Values.operator.sources $k -}}{{- $s = append $s $k -}}{{- end -}}
{{- end -}}
{{- join "," $s -}}
{{- end -}}

{{/* The namespace of the node agent (privileged): agent.namespace.name, else
<release>-agent, apart from the operator and the bridge so that the release namespace can
enforce the restricted Pod Security Standard. Naming the release namespace puts it back there. */}}
{{- define "gpuheal.agent.namespace" -}}
{{- default (printf "%s-agent" .Release.Name) .Values.agent.namespace.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The agent's user name at admission (request.userInfo.username): its ServiceAccount in
its own namespace. */}}
{{- define "gpuheal.agentUser" -}}
{{- printf "system:serviceaccount:%s:%s" (include "gpuheal.agent.namespace" .) (include "gpuheal.agent.serviceAccountName" .) -}}
{{- end -}}

{{/* Fail early on combinations that would deploy something broken. */}}
{{- define "gpuheal.validate" -}}
{{- if and (gt (int .Values.operator.replicas) 1) (le (float64 .Values.operator.leaseDuration) 0.0) -}}
{{- fail "operator.replicas > 1 needs the Lease (operator.leaseDuration > 0): kopf has no leader election, the Lease keeps all but one copy waiting" -}}
{{- end -}}
{{- include "gpuheal.validateDefaultPolicy" . -}}
{{- if eq (include "gpuheal.sources" .) "" -}}
{{- fail "operator.sources: enable at least one of conditions, events, dcgm" -}}
{{- end -}}
{{- if and (include "gpuheal.bridgeURL" .) (not (include "gpuheal.bridgeTokenSecret" .)) -}}
{{- fail "the operator calls a Slurm bridge (bridge.url or slurmBridge.enabled): set bridge.token.existingSecret (or bridge.token.value for a trial)" -}}
{{- end -}}
{{- if and .Values.bridge.token.existingSecret .Values.bridge.token.value -}}
{{- fail "bridge.token: set existingSecret or value, not both" -}}
{{- end -}}
{{- if and .Values.bridge.ca.existingSecret .Values.bridge.ca.existingConfigMap -}}
{{- fail "bridge.ca: set existingSecret or existingConfigMap, not both" -}}
{{- end -}}
{{- if and .Values.operator.sources.dcgm .Values.operator.dcgm.tokenFile (ne .Values.operator.dcgm.scheme "https") -}}
{{- fail "operator.dcgm.tokenFile: only with operator.dcgm.scheme=https (a bearer token over plain HTTP is anyone's on the path)" -}}
{{- end -}}
{{- $agentEvents := include "gpuheal.agent.eventNamespace" . -}}
{{- if and .Values.agent.enabled .Values.operator.sources.events (ne .Values.signalTrust.eventNamespace $agentEvents) -}}
{{- fail (printf "signalTrust.eventNamespace=%s: the agent posts its Events about Nodes in %s, where the operator would not read them" .Values.signalTrust.eventNamespace $agentEvents) -}}
{{- end -}}
{{- end -}}


{{/* A defaultPolicy that would only fail later, at the API server (when Helm creates it,
after the operator is deployed), fails the rendering instead, naming the field. */}}
{{- define "gpuheal.validateDefaultPolicy" -}}
{{- $p := .Values.defaultPolicy -}}
{{- if $p.enabled -}}
{{- $spec := include "gpuheal.defaultPolicySpec" . | fromYaml -}}
{{- if not $spec -}}
{{- fail "defaultPolicy.enabled=true without a spec: set defaultPolicy.catalogue=true (NVIDIA's XID catalogue, in dry run) or give defaultPolicy.spec (a RemediationPolicy spec; see examples/default-policy.yaml)" -}}
{{- end -}}
{{- if not (kindIs "map" $spec.nodeSelector) -}}
{{- fail "defaultPolicy.spec.nodeSelector is required (a label selector; {} selects every node)" -}}
{{- end -}}
{{- if not (and (kindIs "slice" $spec.rules) $spec.rules) -}}
{{- fail "defaultPolicy.spec.rules must be a non-empty list of rules (name, signals, ladder)" -}}
{{- end -}}
{{- range $i, $rule := $spec.rules -}}
{{- if not (and (kindIs "map" $rule) $rule.name $rule.signals (kindIs "slice" $rule.ladder) $rule.ladder) -}}
{{- fail (printf "defaultPolicy.spec.rules[%d] needs name, signals and a non-empty ladder" $i) -}}
{{- end -}}
{{- range $j, $rung := $rule.ladder -}}
{{- if not (and (kindIs "map" $rung) $rung.name (kindIs "slice" $rung.steps) $rung.steps) -}}
{{- fail (printf "defaultPolicy.spec.rules[%d] (%s): ladder[%d] needs a name and a non-empty steps list" $i $rule.name $j) -}}
{{- end -}}
{{- range $k, $step := $rung.steps -}}
{{- if not (and (kindIs "map" $step) $step.action) -}}
{{- fail (printf "defaultPolicy.spec.rules[%d] (%s): ladder[%d].steps[%d] needs an action" $i $rule.name $j $k) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $safety := $spec.safety | default dict -}}
{{- if not (kindIs "map" $spec.safety) -}}
{{- fail "defaultPolicy.spec.safety is required, with exactly one of maxUnhealthy or minHealthy (the circuit breaker)" -}}
{{- end -}}
{{- if eq (hasKey $safety "maxUnhealthy") (hasKey $safety "minHealthy") -}}
{{- fail "defaultPolicy.spec.safety: set exactly one of maxUnhealthy or minHealthy (the circuit breaker)" -}}
{{- end -}}
{{- end -}}
{{- $pool := .Values.defaultReservePool -}}
{{- if and $pool.enabled (not (and (kindIs "map" ($pool.spec | default dict).nodeSelector) ($pool.spec | default dict).nodeSelector)) -}}
{{- fail "defaultReservePool.enabled=true needs defaultReservePool.spec.nodeSelector (which nodes are spares; it must not be empty), e.g. examples/reservepool.yaml's spec" -}}
{{- end -}}
{{- end -}}

{{/* The spec of the defaultPolicy, as YAML: defaultPolicy.spec when given, else the chart's
copy of examples/default-policy.yaml when defaultPolicy.catalogue; safety.dryRun from
defaultPolicy.dryRun. Empty when there is neither. */}}
{{- define "gpuheal.defaultPolicySpec" -}}
{{- $p := .Values.defaultPolicy -}}
{{- $spec := dict -}}
{{- if $p.spec -}}
{{- $spec = deepCopy $p.spec -}}
{{- else if $p.catalogue -}}
{{- $spec = (.Files.Get "files/default-policy.yaml" | fromYaml).spec -}}
{{- end -}}
{{- if and $spec (kindIs "map" $spec.safety) -}}
{{- $_ := set $spec.safety "dryRun" $p.dryRun -}}
{{- end -}}
{{- if $spec }}{{ toYaml $spec }}{{ end -}}
{{- end -}}

{{/* A Prometheus duration of one unit (30s, 90m, 2h, 1d; the schema allows no other) in
seconds, for PromQL comparisons with time(). */}}
{{- define "gpuheal.seconds" -}}
{{- $n := regexFind "^[0-9]+" . | int -}}
{{- $unit := trimPrefix (toString $n) . -}}
{{- mul $n (get (dict "s" 1 "m" 60 "h" 3600 "d" 86400) $unit) -}}
{{- end -}}

{{/* The operator's liveness probe. kopf serves /healthz only once start-up has finished, and
a copy waiting for the Lease never finishes start-up: an httpGet probe would restart every
standby. This one passes while nothing listens on the port (waiting for the Lease, or still
starting) and otherwise needs /healthz to answer 200 within the timeout. */}}
{{- define "gpuheal.livenessCommand" -}}
{{- $port := int .Values.operator.healthPort -}}
{{- $timeout := int .Values.operator.livenessProbe.timeoutSeconds -}}
- python
- -c
- |
  import socket, sys, urllib.request
  try:
      socket.create_connection(("127.0.0.1", {{ $port }}), timeout={{ $timeout }}).close()
  except ConnectionRefusedError:
      sys.exit(0)  # not serving yet: waiting for the Lease, or starting up
  urllib.request.urlopen("http://127.0.0.1:{{ $port }}/healthz", timeout={{ $timeout }})
{{- end -}}

{{/* Readiness probe command (list port timeout), for the operator and the agent: fails
printing /readyz's body (the reasons), which `kubectl describe pod` shows in the probe's
Event; an httpGet probe would show only the status code. */}}
{{- define "gpuheal.readinessCommand" -}}
{{- $port := int (index . 0) -}}
{{- $timeout := int (index . 1) -}}
- python
- -c
- |
  import sys, urllib.error, urllib.request
  try:
      urllib.request.urlopen("http://127.0.0.1:{{ $port }}/readyz", timeout={{ $timeout }})
  except urllib.error.HTTPError as e:
      sys.exit(e.read().decode(errors="replace").strip())
  except OSError as e:
      sys.exit(f"not serving /readyz yet: {e}")
{{- end }}

{{/* Pod-level placement shared by the operator and its test pods. */}}
{{- define "gpuheal.operator.placement" -}}
{{- $op := .Values.operator -}}
{{- with $op.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $op.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $op.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/*
Notification webhooks (notifications.webhooks) as --notify-webhooks items: each one's URL sits
in a Secret (the chart's <fullname>-notify for a `url` value, or your existingSecret), named as
secret:NAME/KEY, so that no URL is in the pod spec; the operator reads it at each send.
*/}}
{{- define "gpuheal.notifySecret" -}}
{{ include "gpuheal.fullname" . }}-notify
{{- end }}

{{- define "gpuheal.notifyWebhooks" -}}
{{- $items := list }}
{{- range $i, $w := .Values.notifications.webhooks }}
{{- $ref := printf "%s/webhook-%d" (include "gpuheal.notifySecret" $) $i }}
{{- if $w.existingSecret }}
{{- $ref = printf "%s/%s" $w.existingSecret ($w.key | default "url") }}
{{- end }}
{{- $items = append $items (printf "%s:secret:%s" (lower ($w.format | default "Generic")) $ref) }}
{{- end }}
{{- join "," $items }}
{{- end }}

{{/* The Secrets the operator may get: the chart's, the existing ones, the policies'. */}}
{{- define "gpuheal.notifySecretNames" -}}
{{- $names := list }}
{{- range .Values.notifications.webhooks }}
{{- $names = append $names (.existingSecret | default (include "gpuheal.notifySecret" $)) }}
{{- end }}
{{- $names = concat $names .Values.notifications.policySecrets }}
{{- $names | uniq | sortAlpha | toJson }}
{{- end }}

{{- /*
How this revision renders a default object (default-objects.yaml), from (list $ kind name):
"release" an ordinary release object; "hook" its CRD is not served yet and this release creates
the CRDs: a post-install hook; "absent" its CRD is not served and this release does not create
it; "adopt" an upgrade that takes over an object already in the cluster but not in the previous
revision's manifest (the install's hook, one kept while defaultPolicy was off, an older chart's
hook): an ordinary object with the spec it has in the cluster, since Helm patches nothing on
the upgrade that takes an object over. The previous revision's modes are in the ConfigMap
<fullname>-default-objects; a release without it (an older chart) had its hooks annotated.
*/}}
{{- define "gpuheal.defaultObjectMode" -}}
{{- $root := index . 0 }}
{{- $kind := index . 1 }}
{{- $name := index . 2 }}
{{- if not ($root.Capabilities.APIVersions.Has (printf "gpuheal.io/v1alpha1/%s" $kind)) }}
{{- ternary "hook" "absent" (and $root.Values.crds.enabled $root.Release.IsInstall) }}
{{- else if not $root.Release.IsUpgrade }}
{{- "release" }}
{{- else }}
{{- $state := lookup "v1" "ConfigMap" $root.Release.Namespace (printf "%s-default-objects" (include "gpuheal.fullname" $root)) }}
{{- $live := lookup "gpuheal.io/v1alpha1" $kind "" $name }}
{{- $annotations := (($live.metadata | default dict).annotations | default dict) }}
{{- $was := get ($state.data | default dict) $kind }}
{{- $inManifest := ternary (has $was (list (printf "release/%s" $name) (printf "adopt/%s" $name))) (not (hasKey $annotations "helm.sh/hook")) (hasKey $state "data") }}
{{- ternary "adopt" "release" (and (hasKey $live "spec") (not $inManifest)) }}
{{- end }}
{{- end -}}
