{{/* The chart's name, or nameOverride. */}}
{{- define "kvroute.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource names: release-chart, or fullnameOverride. */}}
{{- define "kvroute.fullname" -}}
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

{{/* Labels every object carries. */}}
{{- define "kvroute.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvroute.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Labels that select the router pods. */}}
{{- define "kvroute.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvroute.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The admin token's Secret: an existing one, or the chart's. */}}
{{- define "kvroute.adminSecret" -}}
{{- default (printf "%s-admin" (include "kvroute.fullname" .)) .Values.admin.existingSecret }}
{{- end }}

{{/*
The kvroute config file: .Values.config with listen and backends set from
containerPort and engines. Each engine pool is a discovery: dns entry over
its headless Service's A/AAAA records, or its SRV record.
*/}}
{{- define "kvroute.config" -}}
{{- $cfg := deepCopy (default (dict) .Values.config) }}
{{- range $k := list "listen" "backends" }}
{{- if hasKey $cfg $k }}
{{- fail (printf "config.%s is set by the chart (from containerPort and engines); remove it from config" $k) }}
{{- end }}
{{- end }}
{{- $_ := set $cfg "listen" (printf "0.0.0.0:%d" (int .Values.containerPort)) }}
{{- $backends := list }}
{{- range $i, $e := .Values.engines }}
{{- if not $e.service }}
{{- fail (printf "engines[%d].service: the name of the engines' headless Service is required" $i) }}
{{- end }}
{{- $ns := default $.Release.Namespace $e.namespace }}
{{- $host := printf "%s.%s.svc.%s" $e.service $ns $.Values.clusterDomain }}
{{- $scheme := default "http" $e.scheme }}
{{- $b := dict "discovery" "dns" }}
{{- if $e.srv }}
{{- $_ := set $b "srv" (printf "_%s._tcp.%s" (default "http" $e.portName) $host) }}
{{- $_ := set $b "url" (printf "%s://%s" $scheme $host) }}
{{- else }}
{{- $_ := set $b "url" (printf "%s://%s:%d" $scheme $host (int (default 8000 $e.port))) }}
{{- end }}
{{- with $e.name }}{{ $_ := set $b "name" . }}{{ end }}
{{- with $e.models }}{{ $_ := set $b "models" . }}{{ end }}
{{- with $e.kind }}{{ $_ := set $b "kind" . }}{{ end }}
{{- with $e.dnsInterval }}{{ $_ := set $b "dns_interval" . }}{{ end }}
{{- $backends = append $backends $b }}
{{- end }}
{{- if not $backends }}
{{- fail "engines: at least one engine pool is required" }}
{{- end }}
{{- $_ := set $cfg "backends" $backends }}
{{- toYaml $cfg }}
{{- end }}
