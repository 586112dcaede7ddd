{{/* Names, labels and the few values several templates share. */}}

{{- define "gr.name" -}}gpu-remediator{{- end -}}

{{- define "gr.fullname" -}}
{{- if .Values.fullnameOverride -}}{{ .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else if contains "gpu-remediator" .Release.Name -}}{{ .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-gpu-remediator" .Release.Name | trunc 50 | trimSuffix "-" }}
{{- end -}}
{{- end -}}

{{/* gr.common goes with a gr.selector.* (which carries the instance); gr.labels stands alone. */}}
{{- define "gr.common" -}}
app.kubernetes.io/part-of: gpu-remediator
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gr.labels" -}}
app.kubernetes.io/part-of: gpu-remediator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gr.selector.service" -}}
app.kubernetes.io/name: gpu-remediator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gr.selector.agent" -}}
app.kubernetes.io/name: gpu-remediator-agent
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gr.selector.busInit" -}}
app.kubernetes.io/name: gpu-remediator-bus-init
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gr.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The NATS URL every component connects to: nats.url, else the bundled subchart's client service. */}}
{{- define "gr.natsUrl" -}}
{{- if .Values.nats.url -}}{{ .Values.nats.url }}
{{- else if .Values.nats.enabled -}}{{ printf "%s://%s-nats.%s.svc:4222" (ternary "tls" "nats" .Values.nats.clientTls.enabled) .Release.Name .Release.Namespace }}
{{- else -}}{{ fail "nats.url is required when nats.enabled is false (point it at your NATS cluster)" }}
{{- end -}}
{{- end -}}

{{/* The container securityContext of the service and the bus-init Job: non-root, nothing to escalate to. */}}
{{- define "gr.restrictedContainer" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
readOnlyRootFilesystem: true
allowPrivilegeEscalation: false
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* NATS client settings shared by every pod: the credentials file and, with TLS, the CA. */}}
{{- define "gr.natsEnv" -}}
- name: REMEDIATOR_NATS_URL
  value: {{ include "gr.natsUrl" . | quote }}
{{- if .Values.nats.clientTls.enabled }}
- name: REMEDIATOR_NATS_TLS_CA
  value: /etc/gpu-remediator/nats-tls/ca.crt
{{- end }}
{{- end -}}

{{- define "gr.natsTlsVolume" -}}
{{- if .Values.nats.clientTls.enabled }}
- name: nats-tls
  secret:
    secretName: {{ required "nats.clientTls.caSecret is required when nats.clientTls.enabled" .Values.nats.clientTls.caSecret }}
    items: [{key: ca.crt, path: ca.crt}]
    defaultMode: 0444
{{- end }}
{{- end -}}

{{- define "gr.natsTlsMount" -}}
{{- if .Values.nats.clientTls.enabled }}
- {name: nats-tls, mountPath: /etc/gpu-remediator/nats-tls, readOnly: true}
{{- end }}
{{- end -}}

{{/* When the bus-init hook runs. With an existing NATS, before anything is installed or upgraded; with the
bundled subchart, after install (the NATS servers are part of this release and do not exist before it;
serve fails its bus verification and restarts until the hook has run) and before each upgrade. */}}
{{- define "gr.busInitHooks" -}}
{{- if and .Values.nats.enabled (not .Values.nats.url) -}}post-install,pre-upgrade{{- else -}}pre-install,pre-upgrade{{- end -}}
{{- end -}}
