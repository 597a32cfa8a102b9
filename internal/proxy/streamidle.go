package proxy

import "github.com/kvroute/kvroute/internal/lifecycle"

// errStreamIdle is a backend that went silent for
// upstream.stream_idle_timeout after its first byte: a timeout, and a
// failure of the backend (the relay's; the lifecycle owns the bounds
// before the first byte).
var errStreamIdle error = lifecycle.Timeout("the backend sent nothing within upstream.stream_idle_timeout")
