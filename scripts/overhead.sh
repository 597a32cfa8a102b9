#!/usr/bin/env bash
# The router's hop against HAProxy's, side by side on loopback.
#
#   scripts/overhead.sh           # full run: 10 s per measurement, 1,000 streams (about 3 minutes)
#   scripts/overhead.sh --quick   # 3 s per measurement, 200 streams (under a minute)
#
# A static nginx backend answers every POST /v1/chat/completions with the
# same small chat completion. wrk drives it directly, through HAProxy (http
# mode, keep-alive to the backend) and through `kvroute serve` (one backend,
# once per policy), with a 4 KB chat body and a 200 KB agent body. For each
# run it reports req/s, p50 and p99, the proxy's CPU per request (utime +
# stime from /proc), and how many new connections nginx accepted (a hop that
# does not keep its backend connections alive shows here). Then 1,000
# concurrent SSE streams from a fixed-pace backend (a token every 40 ms)
# measure the inter-token latency each hop adds, counting the gaps that end
# while all streams are open, in rounds that take the hops in turn.
#
# Runs on Debian as root or with sudo; installs nginx, haproxy, wrk and curl
# with apt-get when they are missing (Debian's nginx package also enables
# its own service on port 80; the script does not use it). Everything listens on 127.0.0.1 on free
# ports, lives in a temporary directory and is stopped on exit. Nothing is
# pinned to a core: wrk, the proxies and the backends share the machine, as
# they would share a router host, and the comparison is between hops of one
# run. Environment overrides (full-mode defaults):
#
#   OVERHEAD_DURATION=10       seconds per wrk run (plus a 1 s warm-up)
#   OVERHEAD_CONNECTIONS=16    wrk connections
#   OVERHEAD_POLICIES="kvroute round-robin"
#   OVERHEAD_STREAMS=1000      concurrent SSE streams
#   OVERHEAD_SSE_INTERVAL=40ms time between two tokens of a stream
#   OVERHEAD_SSE_TOKENS=100    tokens per stream
#   OVERHEAD_SSE_SPREAD=1s     the streams start evenly over this time
#   OVERHEAD_SSE_ROUNDS=3      rounds of direct, haproxy, kvroute
#   OVERHEAD_KVROUTE=PATH      a kvroute binary to measure instead of building this checkout
set -euo pipefail

quick=0
case "${1:-}" in
"") ;;
--quick) quick=1 ;;
-h | --help)
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	exit 0
	;;
*)
	echo "usage: $0 [--quick]" >&2
	exit 2
	;;
esac
if [ "$quick" = 1 ]; then
	duration=${OVERHEAD_DURATION:-3}
	streams=${OVERHEAD_STREAMS:-200}
	sse_tokens=${OVERHEAD_SSE_TOKENS:-50}
	sse_spread=${OVERHEAD_SSE_SPREAD:-500ms}
	sse_rounds=${OVERHEAD_SSE_ROUNDS:-1}
	warmup=0
else
	duration=${OVERHEAD_DURATION:-10}
	streams=${OVERHEAD_STREAMS:-1000}
	sse_tokens=${OVERHEAD_SSE_TOKENS:-100}
	sse_spread=${OVERHEAD_SSE_SPREAD:-1s}
	sse_rounds=${OVERHEAD_SSE_ROUNDS:-3}
	warmup=1
fi
conns=${OVERHEAD_CONNECTIONS:-16}
policies=${OVERHEAD_POLICIES:-kvroute round-robin}
sse_interval=${OVERHEAD_SSE_INTERVAL:-40ms}

cd "$(dirname "$0")/.."
export PATH="$PATH:/usr/local/go/bin:/usr/sbin:/sbin"
cores=$(nproc)
threads=$((cores < conns ? cores : conns))
hz=$(getconf CLK_TCK)

# --- tools -------------------------------------------------------------
sudo=""
if [ "$(id -u)" -ne 0 ]; then
	sudo=sudo
fi
missing=()
for t in nginx haproxy wrk curl; do
	command -v "$t" >/dev/null || missing+=("$t")
done
if [ ${#missing[@]} -gt 0 ]; then
	echo "installing ${missing[*]} with apt-get" >&2
	$sudo apt-get update -qq
	$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v go >/dev/null || {
	echo "go is not on PATH (nor in /usr/local/go/bin)" >&2
	exit 1
}

# 1,000 streams need about 4 descriptors each in the busiest process
# (client side and backend side, plus the client's and backend's own).
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt $((2 * streams + 256)) ]; then
	echo "warning: ulimit -n is $(ulimit -n); $streams streams through a proxy need at least $((2 * streams + 256))" >&2
fi

# --- processes -----------------------------------------------------------
tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do
		kill "$p" 2>/dev/null || true
	done
	for p in "${pids[@]}"; do
		wait "$p" 2>/dev/null || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "building kvroute" >&2
if [ -n "${OVERHEAD_KVROUTE:-}" ]; then
	cp "$OVERHEAD_KVROUTE" "$tmp/kvroute" # a given build, e.g. an older commit's, to compare with
else
	go build -o "$tmp/kvroute" ./cmd/kvroute
fi
go build -o "$tmp/hopbench" ./scripts/hopbench

read -ra pols <<<"$policies"
mapfile -t port < <("$tmp/hopbench" ports $((6 + ${#pols[@]})))
nginx_port=${port[0]} sse_port=${port[1]} ha_port=${port[2]} ha_sse_port=${port[3]} kv_sse_port=${port[4]} go_port=${port[5]}
kv_ports=("${port[@]:6}")

# start NAME CMD...: runs CMD in the background, its output in $tmp/NAME.log.
start() {
	local name=$1
	shift
	"$@" >"$tmp/$name.log" 2>&1 &
	pids+=($!)
	eval "pid_${name//-/_}=$!"
}

# ready URL NAME: waits up to 10 s for URL to answer 200.
ready() {
	for _ in $(seq 100); do
		if [ "$(curl -s -o /dev/null -w '%{http_code}' "$1")" = 200 ]; then
			return 0
		fi
		sleep 0.1
	done
	echo "$2 did not come up; its log:" >&2
	cat "$tmp/$2.log" >&2
	exit 1
}

# The backend's answer: a small, valid OpenAI chat completion.
answer='{"id":"chatcmpl-bench","object":"chat.completion","created":1764720000,"model":"bench-model","choices":[{"index":0,"message":{"role":"assistant","content":"Route each conversation to the server that already holds its prefix."},"finish_reason":"stop"}],"usage":{"prompt_tokens":1024,"completion_tokens":13,"total_tokens":1037}}'

mkdir -p "$tmp/nginx"
cat >"$tmp/nginx.conf" <<EOF
worker_processes $cores;
daemon off;
pid $tmp/nginx/nginx.pid;
error_log $tmp/nginx/error.log warn;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path $tmp/nginx/body;
    proxy_temp_path $tmp/nginx/proxy;
    fastcgi_temp_path $tmp/nginx/fastcgi;
    uwsgi_temp_path $tmp/nginx/uwsgi;
    scgi_temp_path $tmp/nginx/scgi;
    keepalive_requests 10000000;
    keepalive_timeout 120s;
    # 'return' discards the request body (it is read and dropped, so the
    # connection stays usable); bodies up to 1 MB are accepted.
    client_max_body_size 1m;
    client_body_buffer_size 1m;
    server {
        listen 127.0.0.1:$nginx_port;
        location = /health { return 200 "ok\n"; }
        location = /status { stub_status; }
        location = /v1/chat/completions {
            default_type application/json;
            return 200 '$answer';
        }
    }
}
EOF
start nginx nginx -p "$tmp/nginx" -c "$tmp/nginx.conf" -e "$tmp/nginx/error.log"
start sse "$tmp/hopbench" sse-backend --listen "127.0.0.1:$sse_port" --interval "$sse_interval" --tokens "$sse_tokens"

cat >"$tmp/haproxy.cfg" <<EOF
global
    nbthread $cores
    maxconn $((2 * streams + 512))
defaults
    mode http
    option http-keep-alive
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    timeout http-request 10s
    timeout http-keep-alive 120s
frontend chat
    bind 127.0.0.1:$ha_port
    default_backend nginx
# Streams: without http-no-delay HAProxy sends chunked data with MSG_MORE
# and the kernel holds small SSE events back for up to 200 ms.
frontend stream
    bind 127.0.0.1:$ha_sse_port
    option http-no-delay
    default_backend sse
backend nginx
    http-reuse always
    server nginx 127.0.0.1:$nginx_port
backend sse
    option http-no-delay
    server sse 127.0.0.1:$sse_port
EOF
start haproxy haproxy -db -f "$tmp/haproxy.cfg"
# The floor of a hop built on Go's net/http: its reverse proxy alone.
start go-proxy "$tmp/hopbench" go-proxy --listen "127.0.0.1:$go_port" --target "http://127.0.0.1:$nginx_port"

# kvroute_config PORT POLICY BACKEND MODEL: a minimal serve config with
# one backend, no engine-metric scraping (nginx has no /metrics).
kvroute_config() {
	cat <<EOF
listen: 127.0.0.1:$1
policy: $2
backends:
  - url: $3
    name: backend
    models: [$4]
engines:
  enabled: false
health:
  path: /health
fleet:
  config_poll: 0s
log:
  level: warn
shutdown_grace: 1s
EOF
}
i=0
for pol in $policies; do
	kvroute_config "${kv_ports[$i]}" "$pol" "http://127.0.0.1:$nginx_port" bench-model >"$tmp/kvroute-$pol.yaml"
	start "kvroute-$pol" "$tmp/kvroute" serve --config "$tmp/kvroute-$pol.yaml"
	i=$((i + 1))
done
kvroute_config "$kv_sse_port" kvroute "http://127.0.0.1:$sse_port" bench-stream >"$tmp/kvroute-sse.yaml"
start kvroute-sse "$tmp/kvroute" serve --config "$tmp/kvroute-sse.yaml"

ready "http://127.0.0.1:$nginx_port/health" nginx
ready "http://127.0.0.1:$sse_port/health" sse
ready "http://127.0.0.1:$ha_port/health" haproxy
ready "http://127.0.0.1:$go_port/health" go-proxy
i=0
for pol in $policies; do
	ready "http://127.0.0.1:${kv_ports[$i]}/readyz" "kvroute-$pol"
	i=$((i + 1))
done
ready "http://127.0.0.1:$kv_sse_port/readyz" kvroute-sse

# --- bodies and the wrk script ----------------------------------------
"$tmp/hopbench" body --kind chat --bytes 4096 >"$tmp/body-4KB.json"
"$tmp/hopbench" body --kind agent --bytes 204800 >"$tmp/body-200KB.json"

cat >"$tmp/post.lua" <<'EOF'
-- POST the body in $WRK_BODY; done() prints one machine-readable line.
local f = assert(io.open(os.getenv("WRK_BODY"), "rb"))
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = f:read("*a")
f:close()

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d errors=%d connect=%d read=%d write=%d status=%d timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout, e.connect, e.read, e.write, e.status, e.timeout))
end
EOF

# Each hop answers the real request before anything is measured.
targets=("direct=http://127.0.0.1:$nginx_port" "haproxy=http://127.0.0.1:$ha_port" "go-reverseproxy=http://127.0.0.1:$go_port")
i=0
for pol in $policies; do
	targets+=("kvroute/$pol=http://127.0.0.1:${kv_ports[$i]}")
	i=$((i + 1))
done
for t in "${targets[@]}"; do
	for size in 4KB 200KB; do
		code=$(curl -s -o "$tmp/answer" -w '%{http_code}' -H 'Content-Type: application/json' \
			--data-binary "@$tmp/body-$size.json" "${t#*=}/v1/chat/completions")
		if [ "$code" != 200 ]; then
			echo "${t%%=*} answered $code to the $size body: $(head -c 300 "$tmp/answer")" >&2
			exit 1
		fi
	done
done

ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
accepted() { curl -s "http://127.0.0.1:$nginx_port/status" | awk 'NR == 3 {print $1}'; }

# --- request/response runs ----------------------------------------------
# Results, one line a run: hop size reqs rps p50_ms p99_ms errors cpu_us conns
results=$tmp/results
: >"$results"
echo "$(date -u +%FT%TZ) kvroute $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $cores cores, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "wrk -t $threads -c $conns -d ${duration}s --latency, bodies 4,096 and 204,800 bytes" >&2
for size in 4KB 200KB; do
	for t in "${targets[@]}"; do
		hop=${t%%=*} url=${t#*=}/v1/chat/completions
		case $hop in
		direct) pid="" ;;
		haproxy) pid=$pid_haproxy ;;
		go-reverseproxy) pid=$pid_go_proxy ;;
		kvroute/*)
			v=pid_kvroute_${hop#kvroute/}
			v=${v//-/_}
			pid=${!v}
			;;
		esac
		if [ "$warmup" = 1 ]; then
			WRK_BODY="$tmp/body-$size.json" wrk -t "$threads" -c "$conns" -d 1s -s "$tmp/post.lua" "$url" >/dev/null
		fi
		a0=$(accepted)
		c0=0
		[ -n "$pid" ] && c0=$(ticks "$pid")
		out=$(WRK_BODY="$tmp/body-$size.json" wrk -t "$threads" -c "$conns" -d "${duration}s" --latency -s "$tmp/post.lua" "$url")
		c1=0
		[ -n "$pid" ] && c1=$(ticks "$pid")
		a1=$(accepted)
		line=$(grep '^RESULT' <<<"$out") || {
			echo "wrk printed no result for $hop $size:" >&2
			echo "$out" >&2
			exit 1
		}
		# The stub_status request itself is one accepted connection.
		awk -v hop="$hop" -v size="$size" -v ticks=$((c1 - c0)) -v hz="$hz" -v conns=$((a1 - a0 - 1)) -v haspid="${pid:+1}" '{
			for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
			cpu = haspid ? sprintf("%.1f", ticks / hz * 1e6 / v["requests"]) : "-"
			printf "%s %s %d %.0f %.3f %.3f %d %s %d\n", hop, size, v["requests"], v["requests"] / (v["duration_us"] / 1e6),
				v["p50_us"] / 1000, v["p99_us"] / 1000, v["errors"], cpu, conns
		}' <<<"$line" >>"$results"
		tail -1 "$results" | awk '{printf "  %-22s %-6s %8.0f req/s  p50 %7.3f ms  p99 %7.3f ms  errors %d  cpu %s us/req  new backend conns %d\n", $1, $2, $4, $5, $6, $7, $8, $9}' >&2
		if ! grep -q ' errors=0 ' <<<"$line"; then
			echo "    wrk errors: ${line#*errors=}" >&2
		fi
	done
done

# --- streams ----------------------------------------------------------------
sse_results=$tmp/sse
: >"$sse_results"
echo "$streams concurrent streams started over $sse_spread, a token every $sse_interval, $sse_tokens tokens each, $sse_rounds rounds" >&2
for round in $(seq "$sse_rounds"); do
	for t in "direct=http://127.0.0.1:$sse_port=" "haproxy=http://127.0.0.1:$ha_sse_port=$pid_haproxy" "kvroute=http://127.0.0.1:$kv_sse_port=$pid_kvroute_sse"; do
		IFS='=' read -r hop url pid <<<"$t"
		c0=0
		[ -n "$pid" ] && c0=$(ticks "$pid")
		line=$("$tmp/hopbench" sse-client --target "$url" --streams "$streams" --spread "$sse_spread" --label "$hop")
		c1=0
		[ -n "$pid" ] && c1=$(ticks "$pid")
		echo "  $line" >&2
		# CPU per token counts every token of the run, not only the window's.
		awk -v ticks=$((c1 - c0)) -v hz="$hz" -v haspid="${pid:+1}" -v round="$round" -v tokens=$((streams * sse_tokens)) '{
			for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
			cpu = haspid ? sprintf("%.1f", ticks / hz * 1e6 / tokens) : "-"
			print v["label"], round, v["streams"], v["errors"], v["gaps"], v["itl_p50_ms"], v["itl_p99_ms"], v["itl_p999_ms"], v["itl_max_ms"], cpu
		}' <<<"$line" >>"$sse_results"
	done
done

# --- the table --------------------------------------------------------------
echo
echo "## Request/response: wrk -c $conns -d ${duration}s, static nginx backend, $cores cores"
echo
echo "| hop | body | req/s | p50 ms | p99 ms | added p50 vs direct | req/s vs haproxy | proxy CPU µs/req | new backend conns | errors |"
echo "|---|---|---|---|---|---|---|---|---|---|"
awk '
	{ hop[NR] = $1; size[NR] = $2; rps[NR] = $4; p50[NR] = $5; p99[NR] = $6; err[NR] = $7; cpu[NR] = $8; nc[NR] = $9
	  if ($1 == "direct") dp50[$2] = $5
	  if ($1 == "haproxy") hrps[$2] = $4 }
	END { for (i = 1; i <= NR; i++) {
		added = hop[i] == "direct" ? "-" : sprintf("+%.0f µs", (p50[i] - dp50[size[i]]) * 1000)
		ratio = hop[i] ~ /^(kvroute|go-)/ ? sprintf("%.2fx", rps[i] / hrps[size[i]]) : "-"
		printf "| %s | %s | %.0f | %.3f | %.3f | %s | %s | %s | %d | %d |\n", hop[i], size[i], rps[i], p50[i], p99[i], added, ratio, cpu[i], nc[i], err[i] }
	}' "$results"
echo
echo "## Streams: $streams at once (started over $sse_spread), a token every $sse_interval, $sse_tokens tokens each"
echo
echo "| hop | round | errors | gaps counted | ITL p50 ms | ITL p99 ms | ITL p99.9 ms | ITL max ms | added p99 vs direct | proxy CPU µs/token |"
echo "|---|---|---|---|---|---|---|---|---|---|"
awk '
	{ hop[NR] = $1; rnd[NR] = $2; err[NR] = $4; gaps[NR] = $5; p50[NR] = $6; p99[NR] = $7; p999[NR] = $8; mx[NR] = $9; cpu[NR] = $10
	  if ($1 == "direct") d99[$2] = $7 }
	END { for (i = 1; i <= NR; i++) {
		added = hop[i] == "direct" ? "-" : sprintf("%+.3f ms", p99[i] - d99[rnd[i]])
		printf "| %s | %d | %d | %d | %.3f | %.3f | %.3f | %.3f | %s | %s |\n", hop[i], rnd[i], err[i], gaps[i], p50[i], p99[i], p999[i], mx[i], added, cpu[i]
		if (!(hop[i] in best) || p99[i] < best[hop[i]]) best[hop[i]] = p99[i]
		if (!(hop[i] in order)) { order[hop[i]] = ++nh; names[nh] = hop[i] } }
	  # A busy machine stalls whole rounds; the least disturbed round of each
	  # hop is the fairest comparison.
	  printf "\nlowest ITL p99 over the rounds:"
	  for (j = 1; j <= nh; j++) {
		h = names[j]
		printf " %s %.3f ms", h, best[h]
		if (h != "direct") printf " (%+.3f ms)", best[h] - best["direct"]
		printf j < nh ? ";" : "\n" }
	}' "$sse_results"
