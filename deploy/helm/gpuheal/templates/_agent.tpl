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

{{/* The operator's image unless agent.image.repository is set. */}}
{{- define "gpuheal.agent.image" -}}
{{- if .Values.agent.image.repository -}}
{{- include "gpuheal.image" (list .Values.agent.image .) -}}
{{- else -}}
{{- include "gpuheal.image" (list .Values.operator.image .) -}}
{{- end -}}
{{- end -}}
