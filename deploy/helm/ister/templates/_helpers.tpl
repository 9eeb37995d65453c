{{- define "ister.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ister.headless" -}}
{{- printf "%s-headless" (include "ister.fullname" .) -}}
{{- end -}}

{{- define "ister.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "ister.labels" -}}
{{ include "ister.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ister.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "ister.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The DNS name of one broker pod, through the headless service: the address clients are sent to. */}}
{{- define "ister.podDomain" -}}
{{- printf "%s.%s.svc.%s" (include "ister.headless" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}

{{- define "ister.metricsScheme" -}}
{{- if and .Values.tls.enabled .Values.tls.metrics -}}HTTPS{{- else -}}HTTP{{- end -}}
{{- end -}}

{{/* ister.yml: what the values say, then .Values.config merged over it. */}}
{{- define "ister.config" -}}
{{- $c := dict "mode" "cluster" "cluster_name" .Values.clusterName "data_dir" "/data" -}}
{{- $cluster := dict "etcd_endpoints" .Values.etcd.endpoints "replication_factor" (int .Values.replication.factor) "min_insync_replicas" (int .Values.replication.minInsyncReplicas) -}}
{{- if .Values.etcd.namespace }}{{ $_ := set $cluster "etcd_namespace" .Values.etcd.namespace }}{{ end -}}
{{- if .Values.etcd.tls.secretName -}}
{{- $_ := set $cluster "etcd_tls" (dict "ca_file" "/etc/ister/etcd-tls/ca.crt") -}}
{{- end -}}
{{- $_ := set $c "cluster" $cluster -}}
{{- if .Values.s3.url -}}
{{- $opts := dict "region" .Values.s3.region -}}
{{- if .Values.s3.endpoint }}{{ $_ := set $opts "endpoint" .Values.s3.endpoint }}{{ end -}}
{{- if .Values.s3.allowHttp }}{{ $_ := set $opts "allow_http" "true" }}{{ end -}}
{{- $_ := set $c "storage" (dict "durable" (dict "url" .Values.s3.url "options" $opts)) -}}
{{- end -}}
{{- $security := dict -}}
{{- if .Values.tls.enabled -}}
{{- $tls := dict "cert_file" "/etc/ister/tls/tls.crt" "key_file" "/etc/ister/tls/tls.key" "peer_ca_file" "/etc/ister/tls/ca.crt" -}}
{{- if .Values.tls.mutual }}{{ $_ := set $tls "client_ca_file" "/etc/ister/tls/ca.crt" }}{{ end -}}
{{- if not .Values.tls.metrics }}{{ $_ := set $tls "metrics" (dict "enabled" false) }}{{ end -}}
{{- $_ := set $security "tls" $tls -}}
{{- end -}}
{{- if .Values.auth.enabled -}}
{{- $_ := set $security "auth" (dict "jwt" (dict "secret_file" "/etc/ister/jwt/secret")) -}}
{{- $_ := set $security "superusers" (append .Values.auth.superusers .Values.auth.drainPrincipal) -}}
{{- end -}}
{{- if $security }}{{ $_ := set $c "security" $security }}{{ end -}}
{{- toYaml (mergeOverwrite $c (deepCopy .Values.config)) -}}
{{- end -}}

{{/* Shell lines that point `ister admin` at this pod's broker (TLS and a token when they are on). */}}
{{- define "ister.adminEnv" -}}
{{- if .Values.tls.enabled -}}
export ISTER_ADMIN_ADDR="https://${POD_NAME}.{{ include "ister.podDomain" . }}:{{ .Values.ports.admin }}" ISTER_TLS_CA=/etc/ister/tls/ca.crt
{{- end }}
{{- if .Values.auth.enabled }}
ISTER_TOKEN="$(ister admin security tokens create --principal {{ .Values.auth.drainPrincipal }} --secret-file /etc/ister/jwt/secret --ttl 1h | tail -n 1)" && export ISTER_TOKEN
{{- end }}
{{- end -}}
