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
{{- if .Values.tls.existingSecret }}
{{- if hasKey $cfg "listen_tls" }}
{{- fail "config.listen_tls is set by the chart from tls.existingSecret; remove one" }}
{{- end }}
{{- $_ := set $cfg "listen_tls" (dict "cert_file" "/etc/kvroute-tls/tls.crt" "key_file" "/etc/kvroute-tls/tls.key") }}
{{- end }}
{{- if .Values.engineTLS.existingSecret }}
{{- $up := deepCopy (default (dict) (get $cfg "upstream")) }}
{{- $t := dict "ca_file" "/etc/kvroute-engine-tls/ca.crt" }}
{{- if .Values.engineTLS.clientCert }}
{{- $_ := set $t "cert_file" "/etc/kvroute-engine-tls/tls.crt" }}
{{- $_ := set $t "key_file" "/etc/kvroute-engine-tls/tls.key" }}
{{- end }}
{{- with .Values.engineTLS.serverName }}{{ $_ := set $t "server_name" . }}{{ end }}
{{- $_ := set $up "tls" $t }}
{{- $_ := set $cfg "upstream" $up }}
{{- end }}
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


{{/*
GOMEMLIMIT in bytes: goMemLimitRatio of resources.limits.memory (a
Kubernetes quantity: a number with an optional binary or decimal suffix).
Empty without a memory limit or with a ratio of 0.
*/}}
{{- define "kvroute.gomemlimit" -}}
{{- $limit := "" }}
{{- with .Values.resources }}{{ with .limits }}{{ with .memory }}{{ $limit = toString . }}{{ end }}{{ end }}{{ end }}
{{- $ratio := float64 (default 0 .Values.goMemLimitRatio) }}
{{- if and $limit (gt $ratio 0.0) }}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $limit }}
{{- $suffix := trimPrefix $num $limit }}
{{- $units := dict "" 1.0 "k" 1e3 "M" 1e6 "G" 1e9 "T" 1e12 "Ki" 1024.0 "Mi" 1048576.0 "Gi" 1073741824.0 "Ti" 1099511627776.0 }}
{{- if or (not $num) (not (hasKey $units $suffix)) }}
{{- fail (printf "resources.limits.memory: %q is not a quantity such as 1Gi or 512Mi" $limit) }}
{{- end }}
{{- mulf (float64 $num) (get $units $suffix) $ratio | floor | int64 }}
{{- end }}
{{- end }}

{{/* The topology spread constraints, each with the pods' labels as its
selector unless it names one. */}}
{{- define "kvroute.topologySpread" -}}
{{- $sel := fromYaml (include "kvroute.selectorLabels" .) }}
{{- $out := list }}
{{- range .Values.topologySpreadConstraints }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" $sel) }}
{{- end }}
{{- $out = append $out $c }}
{{- end }}
{{- toYaml $out }}
{{- end }}

{{/* A probe, over HTTPS when the router serves TLS. */}}
{{- define "kvroute.probe" -}}
{{- $root := index . 0 }}
{{- $p := deepCopy (index . 1) }}
{{- if and $root.Values.tls.existingSecret $p.httpGet }}
{{- $_ := set $p.httpGet "scheme" "HTTPS" }}
{{- end }}
{{- toYaml $p }}
{{- end }}
