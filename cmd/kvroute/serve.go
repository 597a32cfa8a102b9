package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/policy"
	"github.com/kvroute/kvroute/internal/server"
)

func init() {
	commands["serve"] = command{"route OpenAI-compatible requests over a fleet of inference servers", runServe}
}

// backendFlags collects repeated --backend URL flags.
type backendFlags []string

func (b *backendFlags) String() string     { return strings.Join(*b, ",") }
func (b *backendFlags) Set(s string) error { *b = append(*b, s); return nil }

// configFlags declares the flags serve and validate share and returns the
// one function both call (and serve again on every reload): it loads the
// file (if any), applies the overrides and runs every check serve makes
// before it starts (config.Check), the environment included.
//
// Precedence, highest first: a flag given on the command line, its
// KVROUTE_* environment variable (envOverrides), the config file, the
// default.
func configFlags(fs *flag.FlagSet) func() (*config.Config, error) {
	path := fs.String("config", "", "YAML config file (see docs/configuration.md); flags override it")
	listen := fs.String("listen", "", "address to listen on (default "+config.DefaultListen+")")
	pol := fs.String("policy", "", "routing policy (default "+policy.Default+"): "+strings.Join(policy.Names(), ", "))
	tracing := fs.Bool("tracing", false, "export OpenTelemetry traces over OTLP (sets tracing.enabled; the OTEL_EXPORTER_OTLP_* variables say where)")
	syncURL := fs.String("sync", "", "share routing state with other replicas over NATS at this URL, e.g. nats://nats:4222 (sets sync.url)")
	eppListen := fs.String("epp-listen", "", "serve as a gateway's Endpoint Picker (ext_proc gRPC) on this address, e.g. :9002 (sets epp.listen)")
	logLevel := fs.String("log-level", "", "debug, info, warn or error (sets log.level; default info)")
	logFormat := fs.String("log-format", "", "text or json (sets log.format; default text)")
	var backends backendFlags
	fs.Var(&backends, "backend", "backend base URL, e.g. http://127.0.0.1:8000; repeat for each backend (replaces the file's list)")
	return func() (*config.Config, error) {
		c := config.Default()
		if *path != "" {
			var err error
			if c, err = config.Load(*path); err != nil {
				return nil, err
			}
		}
		c.Apply(config.Overrides{Listen: *listen, Policy: *pol, Backends: backends, Tracing: *tracing, Sync: *syncURL,
			LogLevel: *logLevel, LogFormat: *logFormat, EPPListen: *eppListen})
		if err := c.Check(); err != nil {
			return nil, err
		}
		return c, nil
	}
}

// envPrefix starts the environment variable of each serve flag: --backend
// is KVROUTE_BACKEND (a comma-separated list), --log-level
// KVROUTE_LOG_LEVEL.
const envPrefix = "KVROUTE_"

// envName is the environment variable that sets flag name.
func envName(name string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// envOverrides sets every flag of fs that the command line left out from
// its KVROUTE_* environment variable, when that is set and not empty: a
// flag given explicitly wins. A repeatable flag (--backend) takes a
// comma-separated list.
func envOverrides(fs *flag.FlagSet, getenv func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		v := strings.TrimSpace(getenv(envName(f.Name)))
		if given[f.Name] || v == "" {
			return
		}
		vals := []string{v}
		if _, list := f.Value.(*backendFlags); list {
			vals = strings.Split(v, ",")
		}
		for _, x := range vals {
			if x = strings.TrimSpace(x); x == "" {
				continue
			}
			if err := fs.Set(f.Name, x); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// parseConfigFlags parses serve's or validate's args, then the KVROUTE_*
// environment overrides; ok false as parseFlags.
func parseConfigFlags(fs *flag.FlagSet, args []string) (code int, ok bool) {
	if code, ok := parseFlags(fs, args, true); !ok {
		return code, false
	}
	if err := envOverrides(fs, os.Getenv); err != nil {
		fmt.Fprintf(os.Stderr, "kvroute %s: %v\n", fs.Name(), err)
		return 2, false
	}
	return 0, true
}

func runServe(args []string) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	load := configFlags(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `usage: kvroute serve [--config FILE] [--listen ADDR] [--backend URL]... [--policy NAME] [--tracing] [--sync nats://HOST:4222] [--log-level LEVEL] [--log-format text|json]

Routes POST /v1/chat/completions and /v1/completions (streaming or not) to
the backend with the best expected time to first token, keeping
conversations and shared prefixes where their KV cache is. Also serves
GET /v1/models (the union of the backends'), other /v1/* paths, /healthz
(also as /health), /readyz and /metrics.

Every flag can also be set by an environment variable, KVROUTE_ and its
name in capitals with _ for - (KVROUTE_BACKEND takes a comma-separated
list). Precedence: the command line, then the environment, then the
config file, then the default.

flags:
`)
		printDefaults(fs)
	}
	if code, ok := parseConfigFlags(fs, args); !ok {
		return code
	}
	cfg, err := load()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvroute serve: %v\n", err)
		return 2
	}
	log := newLogger(os.Stderr, cfg.Log)
	srv, err := server.New(cfg, log)
	if err != nil {
		log.Error("start", "err", err)
		return 1
	}
	// The signals are caught before the listener opens: a SIGTERM that
	// comes as soon as the router serves must drain it, not kill it.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := srv.Start(); err != nil {
		log.Error("start", "err", err)
		return 1
	}
	go watchReloads(ctx, watchedFiles(fs.Lookup("config").Value.String(), cfg), cfg.Fleet.ConfigPoll, srv, load, log)
	<-ctx.Done()
	stop() // a second signal kills the process at once
	log.Info("shutting down: waiting for in-flight requests", "grace", cfg.ShutdownGrace)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("shutdown: closed remaining connections", "err", err)
		return 1
	}
	log.Info("stopped")
	return 0
}

// watchedFiles are the files whose change reloads the router: the config
// file and the listener's certificate and key ("" for those not set).
func watchedFiles(configPath string, cfg *config.Config) []string {
	return []string{configPath, cfg.ListenTLS.CertFile, cfg.ListenTLS.KeyFile}
}

// newLogger builds the router's logger from the log section.
func newLogger(w io.Writer, c config.Log) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.Level)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
