package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/server"
)

// watchReloads reloads srv's configuration with load on SIGHUP and, when
// poll is positive, whenever one of the files at paths changes (the
// config file, and the listener's certificate and key, which cert-manager
// renews in place), until ctx is done. An invalid configuration is logged
// and ignored.
func watchReloads(ctx context.Context, paths []string, poll time.Duration, srv *server.Server, load func() (*config.Config, error), log *slog.Logger) {
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
	for _, path := range paths {
		if path == "" || poll <= 0 {
			continue
		}
		go config.Watch(ctx, path, poll, func() {
			log.Info("reload: file changed", "path", path)
			kick()
		})
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			log.Info("reload: SIGHUP")
		case <-reload:
		}
		_ = srv.ReloadWith(load)
	}
}
