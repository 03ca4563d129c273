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

{{- define "gpuheal.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gpuheal.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* image reference: repository@digest, or repository:tag (tag defaults to appVersion). */}}
{{- define "gpuheal.image" -}}
{{- $img := index . 0 -}}
{{- $root := index . 1 -}}
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

{{/* Fail early on combinations that would deploy something broken. */}}
{{- define "gpuheal.validate" -}}
{{- if ne (int .Values.operator.replicas) 1 -}}
{{- fail "operator.replicas must be 1: kopf has no leader election (gpuheal runs it standalone)" -}}
{{- end -}}
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
{{- end -}}

