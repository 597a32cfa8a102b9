package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/kvevents"
)

func init() {
	commands["engine"] = command{"run an emulated vLLM-compatible inference server", runEngine}
}

func runEngine(args []string) int {
	fs := flag.NewFlagSet("engine", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8000", "address to serve the vLLM API on")
	preset := fs.String("preset", "h100-llama3-8b", "hardware and model setup whose timing is emulated (see the list below)")
	kvBlocks := fs.Int("kv-blocks", 0, "KV cache capacity in blocks of 16 tokens; 0 means the preset's")
	timeScale := fs.Float64("time-scale", 1.0, "emulated seconds per real second: 10 runs the engine ten times faster than the hardware")
	model := fs.String("model", "", "served model name; empty means the preset's")
	kvConfig := fs.String("kv-events-config", "", `publish KV cache events as vLLM does: vLLM's JSON, e.g. '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558","topic":"kv@pod@model"}'`)
	kvEncoding := fs.String("kv-events-encoding", "current", "shape of the published events: current (maps with a \"type\" key, vLLM since 2026) or legacy (positional arrays, vLLM up to 0.23 and SGLang)")
	role := fs.String("role", "both", "part in a disaggregated fleet: prefill (answers vLLM's prefill legs with kv_transfer_params), decode (receives a prompt's KV cache instead of computing it) or both")
	transferLatency := fs.Duration("kv-transfer-latency", 0, "fixed time of a KV cache transfer from a prefill engine; unset means the preset's")
	transferPerToken := fs.Duration("kv-transfer-time-per-token", 0, "time a KV cache transfer takes per prompt token; unset means the preset's")
	var limits limitFlags
	limits.register(fs)
	var loras emulator.LoRAModules
	fs.Var(&loras, "lora-modules", `LoRA adapters to serve, as vLLM's flag: name=path or '{"name":...,"path":...,"base_model_name":...}', several after one flag or the flag repeated (needs --max-loras; 1 if not given)`)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprint(out, `usage: kvroute engine [--listen ADDR] [--preset NAME] [--kv-blocks N] [--time-scale X] [--model NAME]
                      [--kv-events-config JSON] [--kv-events-encoding current|legacy]
                      [--max-num-seqs N] [--max-num-batched-tokens N] [--cpu-kv-blocks N]
                      [--lora-modules name=path ... [--max-loras N] [--lora-load-time D]]
                      [--role prefill|decode|both] [--kv-transfer-latency D]
                      [--kv-transfer-time-per-token D]

Serves an emulated vLLM engine: POST /v1/chat/completions, POST /v1/completions,
POST /v1/responses (with its store: GET, DELETE /v1/responses/{id}, .../cancel,
.../input_items) and POST /v1/messages (Anthropic's; and .../count_tokens), all
streaming or not, GET /v1/models, GET /health, GET /metrics in vLLM's
metric names, POST /tokenize and POST /reset_prefix_cache. Scheduling, prefix
caching and step timing follow the preset; with --kv-events-config the
engine publishes its KV cache events on ZMQ as vLLM does. In a
disaggregated fleet it speaks vLLM's NixlConnector protocol
(kv_transfer_params): --role prefill answers prefill legs, --role decode
receives the prompt's KV cache, waiting the transfer time.

flags:
`)
		printDefaults(fs)
		fmt.Fprintln(out, "\npresets:")
		for _, p := range engine.Presets() {
			fmt.Fprintf(out, "  %-22s model %s, %d KV blocks, context %d, max-num-seqs %d, max-num-batched-tokens %d, %.0f prefill tokens/s\n",
				p.Name, p.Model, p.KVBlocks, p.MaxModelLen, p.MaxNumSeqs, p.MaxBatchedTokens, p.PrefillTokensPerSec())
		}
	}
	if code, ok := parseFlags(fs, args, false); !ok {
		return code
	}
	// vLLM's --lora-modules takes every value up to the next flag.
	for len(loras) > 0 && fs.NArg() > 0 && !strings.HasPrefix(fs.Arg(0), "-") {
		rest := fs.Args()
		i := 0
		for ; i < len(rest) && !strings.HasPrefix(rest[i], "-"); i++ {
			if err := loras.Set(rest[i]); err != nil {
				fmt.Fprintf(os.Stderr, "kvroute engine: --lora-modules: %v\n", err)
				return 2
			}
		}
		if code, ok := parseFlags(fs, rest[i:], false); !ok {
			return code
		}
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "kvroute engine: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if len(loras) > 0 && limits.maxLoras == 0 {
		limits.maxLoras = 1 // vLLM's default
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	p, err := enginePreset(*preset, limits)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvroute engine: %v\n", err)
		return 2
	}
	if *timeScale <= 0 {
		fmt.Fprintf(os.Stderr, "kvroute engine: --time-scale must be positive, got %g\n", *timeScale)
		return 2
	}
	if *kvBlocks < 0 {
		fmt.Fprintf(os.Stderr, "kvroute engine: --kv-blocks must be at least 0, got %d\n", *kvBlocks)
		return 2
	}
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "kv-transfer-latency":
			p.KVTransferLatency = *transferLatency
		case "kv-transfer-time-per-token":
			p.KVTransferPerToken = *transferPerToken
		}
	})
	if p.KVTransferLatency < 0 || p.KVTransferPerToken < 0 {
		fmt.Fprintf(os.Stderr, "kvroute engine: --kv-transfer-latency and --kv-transfer-time-per-token must not be negative\n")
		return 2
	}
	cfg := emulator.Config{Preset: p, KVBlocks: *kvBlocks, TimeScale: *timeScale, Model: *model, Logger: log, LoRAModules: loras, Role: *role}
	enc, err := kvevents.ParseEncoding(*kvEncoding)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvroute engine: --kv-events-encoding: %v\n", err)
		return 2
	}
	if *kvConfig != "" {
		kc, on, err := kvevents.ParseConfig([]byte(*kvConfig))
		if err != nil {
			fmt.Fprintf(os.Stderr, "kvroute engine: --kv-events-config: %v\n", err)
			return 2
		}
		if on {
			kc.Encoding = enc
			cfg.KVEvents = &kc
		}
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvroute engine: listen %s: %v\n", *listen, err)
		return 1
	}
	// Its prefill answers name the listening address as their side channel.
	cfg.SideChannel = ln.Addr().String()
	srv, err := emulator.New(cfg)
	if err != nil {
		ln.Close()
		fmt.Fprintf(os.Stderr, "kvroute engine: %v\n", err)
		return 2
	}
	defer srv.Close()
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	eff := srv.Preset()
	log.Info("engine listening", "addr", "http://"+ln.Addr().String(), "preset", eff.Name,
		"model", srv.Model(), "kv_blocks", eff.KVBlocks, "max_num_seqs", eff.MaxNumSeqs,
		"max_num_batched_tokens", eff.MaxBatchedTokens, "time_scale", *timeScale, "role", *role,
		"kv_transfer_latency", eff.KVTransferLatency, "kv_transfer_time_per_token", eff.KVTransferPerToken,
		"max_loras", limits.maxLoras, "lora_modules", loraNames(loras))
	if cfg.KVEvents != nil {
		log.Info("publishing kv events", "endpoint", cfg.KVEvents.Endpoint, "replay_endpoint", cfg.KVEvents.ReplayEndpoint,
			"topic", cfg.KVEvents.Topic, "encoding", enc)
	}
	select {
	case err := <-errc:
		log.Error("serve", "err", err)
		return 1
	case <-ctx.Done():
	}
	stop() // a second signal kills at once
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		// Streams still open after the grace period are cut.
		log.Warn("shutdown", "err", err)
		hs.Close()
	}
	return 0
}

// loraNames lists the adapters' names for the startup line, each with its
// base model when it names one: "sql, chat (base llama)".
func loraNames(mods emulator.LoRAModules) string {
	names := make([]string, len(mods))
	for i, m := range mods {
		names[i] = m.Name
		if m.Base != "" {
			names[i] += " (base " + m.Base + ")"
		}
	}
	return strings.Join(names, ", ")
}
