{{/* The node agent (`gpuheal agent`): names, labels and its image. */}}
{{- define "gpuheal.agent.fullname" -}}
{{- printf "%s-agent" (include "gpuheal.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "gpuheal.agent.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuheal.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: agent
{{- end -}}

{{- define "gpuheal.agent.serviceAccountName" -}}
{{- if .Values.agent.serviceAccount.create -}}
{{- default (include "gpuheal.agent.fullname" .) .Values.agent.serviceAccount.name -}}
{{- else -}}
{{- required "agent.serviceAccount.name is required when agent.serviceAccount.create is false" .Values.agent.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Namespace of the agent's Events: the API server accepts Events about a cluster-scoped
object (a Node) only in `default`. */}}
{{- define "gpuheal.agent.eventNamespace" -}}
default
{{- end -}}

{{/* The operator's image unless agent.image.repository is set; the agent's own tag or
digest wins either way (a digest set with an empty repository pins the operator's). */}}
{{- define "gpuheal.agent.image" -}}
{{- $a := .Values.agent.image -}}
{{- $o := .Values.operator.image -}}
{{- if or $a.repository $a.digest $a.tag -}}
{{- $img := dict "repository" (default $o.repository $a.repository) "tag" $a.tag "digest" $a.digest -}}
{{- include "gpuheal.image" (list $img . "agent.image") -}}
{{- else -}}
{{- include "gpuheal.image" (list $o . "operator.image") -}}
{{- end -}}
{{- end -}}
