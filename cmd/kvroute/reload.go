package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/proxy"
)

// watchReloads reloads srv's configuration with load on SIGHUP and, when
// path is set and poll is positive, whenever the file at path changes,
// until ctx is done. An invalid configuration is logged and ignored.
func watchReloads(ctx context.Context, path string, poll time.Duration, srv *proxy.Server, load func() (*config.Config, error), log *slog.Logger) {
	reload := make(chan struct{}, 1)
	kick := func() {
		select {
		case reload <- struct{}{}:
		default: // a reload is already pending; it will read the latest file
		}
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	if path != "" && poll > 0 {
		go config.Watch(ctx, path, poll, kick)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			log.Info("reload: SIGHUP")
		case <-reload:
			log.Info("reload: config file changed", "path", path)
		}
		_ = srv.ReloadWith(load)
	}
}
