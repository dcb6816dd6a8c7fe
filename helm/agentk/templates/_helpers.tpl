{{/* Chart name, overridable. */}}
{{- define "agentk.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: the release name, with the chart name unless the release name contains it. */}}
{{- define "agentk.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Cluster-scoped names include the namespace: two agents may be installed in one cluster. */}}
{{- define "agentk.clusterName" -}}
{{- printf "%s-%s" .Release.Namespace (include "agentk.fullname" .) | trunc 253 | trimSuffix "-" }}
{{- end }}

{{- define "agentk.selectorLabels" -}}
app.kubernetes.io/name: {{ include "agentk.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "agentk.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "agentk.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: agent
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "agentk.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "agentk.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create=false (an existing ServiceAccount agentk runs as)" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding the token: the user's existingSecret or the chart's. */}}
{{- define "agentk.tokenSecretName" -}}
{{- if .Values.config.existingSecret }}
{{- .Values.config.existingSecret }}
{{- else }}
{{- include "agentk.fullname" . }}-token
{{- end }}
{{- end }}

{{/* Where the token and CA files are mounted (agentk --token-file / --ca-cert-file). */}}
{{- define "agentk.tokenDir" -}}/etc/agentk/token{{- end }}
{{- define "agentk.caDir" -}}/etc/agentk/ca{{- end }}

{{/* Seconds Kubernetes waits after SIGTERM; must exceed agentk's grace period. */}}
{{- define "agentk.terminationGracePeriodSeconds" -}}
{{- $grace := int .Values.config.gracePeriodSeconds }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $grace 10 }}
{{- else }}
{{- $termination := int .Values.terminationGracePeriodSeconds }}
{{- if le $termination $grace }}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed config.gracePeriodSeconds (%d): Kubernetes would kill agentk while in-flight requests are still finishing" $termination $grace) }}
{{- end }}
{{- $termination }}
{{- end }}
{{- end }}

{{/* Checks of values that the schema cannot express; included by the Deployment. */}}
{{- define "agentk.validate" -}}
{{- if not .Values.config.kasAddress }}
{{- fail "config.kasAddress is required: kas's agent listener, e.g. --set config.kasAddress=grpcs://kas.example.com:443" }}
{{- end }}
{{- if and .Values.config.existingSecret .Values.config.token }}
{{- fail "set either config.token or config.existingSecret, not both" }}
{{- end }}
{{- if not (or .Values.config.existingSecret .Values.config.token) }}
{{- fail "the agent token is required: --set-file config.token=<file with the token>, or --set config.existingSecret=<Secret with key config.existingSecretKey>" }}
{{- end }}
{{- if and .Values.config.caCert (not (hasPrefix "grpcs://" .Values.config.kasAddress)) }}
{{- fail "config.caCert is only used with a grpcs:// config.kasAddress (agentk refuses --ca-cert-file otherwise)" }}
{{- end }}
{{- if gt (int .Values.config.minIdleTunnels) (int .Values.config.maxTunnels) }}
{{- fail (printf "config.minIdleTunnels (%d) must not exceed config.maxTunnels (%d)" (int .Values.config.minIdleTunnels) (int .Values.config.maxTunnels)) }}
{{- end }}
{{- if .Values.networkPolicy.enabled }}
{{- if not .Values.networkPolicy.kas.to }}
{{- fail "networkPolicy.kas.to is required when networkPolicy.enabled: the addresses of kas (NetworkPolicyPeers, e.g. [{ipBlock: {cidr: 203.0.113.10/32}}])" }}
{{- end }}
{{- if not .Values.networkPolicy.apiServer.to }}
{{- fail "networkPolicy.apiServer.to is required when networkPolicy.enabled: the Kubernetes API server endpoints (kubectl get endpointslices -l kubernetes.io/service-name=kubernetes)" }}
{{- end }}
{{- end }}
{{- end }}
