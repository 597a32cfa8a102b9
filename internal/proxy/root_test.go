package proxy_test

import (
	"log/slog"

	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/proxy"
	"github.com/kvroute/kvroute/internal/server"
)

func init() {
	proxy.BuildRouter = func(cfg *config.Config, logger *slog.Logger) (*proxy.Server, proxy.Root, error) {
		s, err := server.New(cfg, logger)
		if err != nil {
			return nil, nil, err
		}
		return s.Proxy(), s, nil
	}
}
