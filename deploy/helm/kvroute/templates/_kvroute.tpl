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
{{- $backends = append $backends (fromJson (include "kvroute.backend" (list $ $i $e))) }}
{{- end }}
{{- if not $backends }}
{{- fail "engines: at least one engine pool is required" }}
{{- end }}
{{- $_ := set $cfg "backends" $backends }}
{{- if .Values.sync.enabled }}
{{- $_ := set $cfg "sync" (fromJson (include "kvroute.syncConfig" .)) }}
{{- end }}
{{- if .Values.epp.enabled }}
{{- if hasKey $cfg "epp" }}
{{- fail "config.epp is set by the chart from epp; remove it from config" }}
{{- end }}
{{- $_ := set $cfg "epp" (dict "listen" (printf "0.0.0.0:%d" (int .Values.epp.port)) "health_listen" (printf "0.0.0.0:%d" (int .Values.epp.healthPort)) "fallbacks" (int .Values.epp.fallbacks)) }}
{{- end }}
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

{{/*
How engine pool i finds its engines: its discovery, else the chart's.
*/}}
{{- define "kvroute.discovery" -}}
{{- $root := index . 0 }}{{ $e := index . 1 }}
{{- $d := default $root.Values.discovery $e.discovery }}
{{- if not (has $d (list "dns" "kubernetes")) }}
{{- fail (printf "discovery: %q is not dns or kubernetes" $d) }}
{{- end }}
{{- $d }}
{{- end }}

{{/*
One backends[] entry of the config, as JSON, from engine pool i: with dns
discovery, the headless Service's A/AAAA or SRV records; with kubernetes,
a Service's EndpointSlices, pods by label or an InferencePool, watched in
the Kubernetes API (the RBAC in rbac.yaml lets the router read them).
*/}}
{{- define "kvroute.backend" -}}
{{- $root := index . 0 }}{{ $i := index . 1 }}{{ $e := index . 2 }}
{{- $ns := default $root.Release.Namespace $e.namespace }}
{{- $scheme := default "http" $e.scheme }}
{{- $b := dict }}
{{- if eq (include "kvroute.discovery" (list $root $e)) "kubernetes" }}
{{- if $e.srv }}
{{- fail (printf "engines[%d].srv: SRV records are for discovery: dns, not kubernetes" $i) }}
{{- end }}
{{- $k := dict "namespace" $ns }}
{{- $what := 0 }}
{{- with $e.service }}{{ $_ := set $k "service" . }}{{ $what = add1 $what }}{{ end }}
{{- with $e.selector }}{{ $_ := set $k "selector" . }}{{ $what = add1 $what }}{{ end }}
{{- with $e.inferencePool }}{{ $_ := set $k "inference_pool" . }}{{ $what = add1 $what }}{{ end }}
{{- if ne $what 1 }}
{{- fail (printf "engines[%d]: with discovery: kubernetes set exactly one of service (its EndpointSlices), selector (pods by label) and inferencePool" $i) }}
{{- end }}
{{- if $e.inferencePool }}
{{- if or $e.port $e.portName }}
{{- fail (printf "engines[%d]: leave port and portName out with inferencePool (its targetPorts give the port)" $i) }}
{{- end }}
{{- else if $e.portName }}
{{- $_ := set $k "port" $e.portName }}
{{- else if $e.port }}
{{- $_ := set $k "port" (toString (int $e.port)) }}
{{- else if $e.selector }}
{{- fail (printf "engines[%d]: port or portName is required with selector" $i) }}
{{- end }}
{{- $_ := set $b "discovery" "kubernetes" }}
{{- $_ := set $b "kubernetes" $k }}
{{- if ne $scheme "http" }}
{{- $_ := set $b "url" (printf "%s://%s.%s" $scheme (default "pods" (default $e.inferencePool $e.service)) $ns) }}
{{- end }}
{{- else }}
{{- if not $e.service }}
{{- fail (printf "engines[%d].service: the name of the engines' headless Service is required" $i) }}
{{- end }}
{{- if or $e.selector $e.inferencePool }}
{{- fail (printf "engines[%d]: selector and inferencePool need discovery: kubernetes" $i) }}
{{- end }}
{{- $host := printf "%s.%s.svc.%s" $e.service $ns $root.Values.clusterDomain }}
{{- $_ := set $b "discovery" "dns" }}
{{- if $e.srv }}
{{- $_ := set $b "srv" (printf "_%s._tcp.%s" (default "http" $e.portName) $host) }}
{{- $_ := set $b "url" (printf "%s://%s" $scheme $host) }}
{{- else }}
{{- $_ := set $b "url" (printf "%s://%s:%d" $scheme $host (int (default 8000 $e.port))) }}
{{- end }}
{{- with $e.dnsInterval }}{{ $_ := set $b "dns_interval" . }}{{ end }}
{{- end }}
{{- with $e.name }}{{ $_ := set $b "name" . }}{{ end }}
{{- with $e.models }}{{ $_ := set $b "models" . }}{{ end }}
{{- with $e.kind }}{{ $_ := set $b "kind" . }}{{ end }}
{{- with $e.role }}{{ $_ := set $b "role" . }}{{ end }}
{{- with $e.kvEvents }}{{ $_ := set $b "kv_events" (toString .) }}{{ end }}
{{- with $e.kvEventsReplay }}{{ $_ := set $b "kv_events_replay" (toString .) }}{{ end }}
{{- with $e.preset }}{{ $_ := set $b "preset" . }}{{ end }}
{{- toJson $b }}
{{- end }}

{{/*
What the router reads in the Kubernetes API, as JSON: for each namespace
with an engine pool on kubernetes discovery, the resources of the Role
there. Pods always (a selector's or an InferencePool's pods, and the
labels of a Service's endpoints); EndpointSlices for a Service;
InferencePools for a pool. {} with DNS discovery only.
*/}}
{{- define "kvroute.apiAccess" -}}
{{- $access := dict }}
{{- range $e := .Values.engines }}
{{- if eq (include "kvroute.discovery" (list $ $e)) "kubernetes" }}
{{- $ns := default $.Release.Namespace $e.namespace }}
{{- $r := default (dict "pods" true) (get $access $ns) }}
{{- if $e.service }}{{ $_ := set $r "endpointslices" true }}{{ end }}
{{- if $e.inferencePool }}{{ $_ := set $r "inferencepools" true }}{{ end }}
{{- $_ := set $access $ns $r }}
{{- end }}
{{- end }}
{{- toJson $access }}
{{- end }}

{{/* The ServiceAccount the routers run as with API discovery. */}}
{{- define "kvroute.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kvroute.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The sync key's Secret: an existing one, or the chart's. */}}
{{- define "kvroute.syncSecret" -}}
{{- default (printf "%s-sync" (include "kvroute.fullname" .)) .Values.sync.existingSecret }}
{{- end }}

{{/*
The config's sync section, as JSON: config.sync (heartbeat, peer_timeout,
max_peers...) with the NATS URL, the credentials file and the TLS files
the chart mounts. The shared key is KVROUTE_SYNC_KEY, from the Secret.
*/}}
{{- define "kvroute.syncConfig" -}}
{{- $s := deepCopy (default (dict) (get (default (dict) .Values.config) "sync")) }}
{{- range $k := list "url" "key_file" "credentials_file" "tls" "user" "password" "token" }}
{{- if hasKey $s $k }}
{{- fail (printf "config.sync.%s: with sync.enabled the chart sets the NATS URL, key and credentials from sync.*; remove it from config.sync" $k) }}
{{- end }}
{{- end }}
{{- if not .Values.sync.url }}
{{- fail "sync.enabled needs sync.url, the NATS server(s), e.g. nats://nats.nats.svc.cluster.local:4222" }}
{{- end }}
{{- if not (or .Values.sync.existingSecret .Values.sync.key) }}
{{- fail "sync.enabled needs sync.existingSecret or sync.key: the key the replicas sign their messages with (openssl rand -hex 32)" }}
{{- end }}
{{- with $s.max_peers }}
{{- if lt (int .) (int $.Values.replicaCount) }}
{{- fail (printf "config.sync.max_peers: %d is fewer than replicaCount (%d): a rolling update runs old and new replicas side by side" (int .) (int $.Values.replicaCount)) }}
{{- end }}
{{- end }}
{{- $_ := set $s "url" .Values.sync.url }}
{{- with .Values.sync.credentials.existingSecret }}
{{- $_ := set $s "credentials_file" (printf "/etc/kvroute-sync-creds/%s" $.Values.sync.credentials.secretKey) }}
{{- end }}
{{- with .Values.sync.tls.existingSecret }}
{{- $t := dict "ca_file" "/etc/kvroute-sync-tls/ca.crt" }}
{{- if $.Values.sync.tls.clientCert }}
{{- $_ := set $t "cert_file" "/etc/kvroute-sync-tls/tls.crt" }}
{{- $_ := set $t "key_file" "/etc/kvroute-sync-tls/tls.key" }}
{{- end }}
{{- $_ := set $s "tls" $t }}
{{- end }}
{{- toJson $s }}
{{- end }}

{{/*
The InferencePool's name (epp.inferencePool.name, else the release's full
name).
*/}}
{{- define "kvroute.inferencePool" -}}
{{- default (include "kvroute.fullname" .) .Values.epp.inferencePool.name }}
{{- end }}
