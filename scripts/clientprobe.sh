#!/usr/bin/env bash
# The hostile clients of docs/reliability.md (issue 28) against one kvroute
# binary, on loopback:
#
#   scripts/clientprobe.sh BINARY headers [--conns 1000] [--bytes 65536]
#       connections holding unfinished headers: the router's resident memory
#   scripts/clientprobe.sh BINARY bodies [--sent 1] [--from 127.0.0.2] [--wait 6s]
#       8 connections declaring 32 MiB bodies and stalling: do others get served?
#   scripts/clientprobe.sh BINARY idle [--conns 15000]
#       idle keep-alive connections, then one more client
#   scripts/clientprobe.sh BINARY loop
#       a backend URL that points at the router itself: one request
#
# BINARY is a built `kvroute` (go build -o /tmp/kvroute ./cmd/kvroute). An
# emulated engine (kvroute engine, 10x time) is the backend on port 18000,
# the router listens on 18080 (18081 for loop), with default limits.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=$(realpath "$1"); shift
what=$1; shift
dir=$(mktemp -d)
go build -o "$dir/clientprobe" ./scripts/clientprobe
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$dir"' EXIT
if [ "$what" = loop ]; then
	printf 'listen: 127.0.0.1:18081\nbackends: [{url: http://127.0.0.1:18081, models: [m]}]\nhealth: {interval: 1h}\nlog: {level: error}\n' >"$dir/cfg.yaml"
	"$bin" serve --config "$dir/cfg.yaml" >"$dir/serve.log" 2>&1 &
	spid=$!
	pids+=($spid)
	for _ in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:18081/healthz && break; sleep 0.2; done
	r0=$(awk '/VmRSS/{print $2}' /proc/$spid/status)
	out=$(curl -s -m 8 -w ' HTTP %{http_code} in %{time_total}s' -H 'Content-Type: application/json' \
		-d '{"model":"m","prompt":"hi"}' http://127.0.0.1:18081/v1/completions || true)
	r1=$(awk '/VmRSS/{print $2}' /proc/$spid/status)
	g=$(curl -s -m 5 http://127.0.0.1:18081/metrics | awk '/^go_goroutines /{print $2}')
	echo "answer: ${out: -100}; rss ${r0} kB -> ${r1} kB; goroutines after: ${g:-?}"
	exit 0
fi
printf 'listen: 127.0.0.1:18080\nbackends: [{url: http://127.0.0.1:18000}]\nlog: {level: error}\n' >"$dir/cfg.yaml"
"$bin" engine --listen 127.0.0.1:18000 --time-scale 10 >"$dir/engine.log" 2>&1 &
pids+=($!)
"$bin" serve --config "$dir/cfg.yaml" >"$dir/serve.log" 2>&1 &
spid=$!
pids+=($spid)
for _ in $(seq 50); do curl -sf http://127.0.0.1:18080/readyz >/dev/null && break; sleep 0.2; done
case "$what" in
headers) "$dir/clientprobe" headers --target 127.0.0.1:18080 --pid "$spid" "$@" ;;
bodies) "$dir/clientprobe" bodies --target 127.0.0.1:18080 "$@" ;;
idle) "$dir/clientprobe" idle --target 127.0.0.1:18080 "$@" ;;
*) echo "unknown probe $what" >&2; exit 2 ;;
esac
