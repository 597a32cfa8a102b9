package proxy

import (
	"os"
	"os/exec"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/config"
)

func TestZZProfileHop(t *testing.T) {
	if os.Getenv("ZZPROF") == "" {
		t.Skip()
	}
	backend := newStaticB(&testing.B{})
	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Backends = []config.Backend{{URL: backend.URL, Name: "bench", Models: []string{"bench-model"}}}
	cfg.Health.Interval = time.Hour
	cfg.Engines.Enabled = false
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, _ := New(cfg, nil)
	srv.Start()
	body := hopBody("bench-model", 4<<10)
	if os.Getenv("ZZSIZE") == "200" {
		body = hopBody("bench-model", 200<<10)
	}
	os.WriteFile("/tmp/zzbody.json", []byte(body), 0o644)
	os.WriteFile("/tmp/zz.lua", []byte(`wrk.method="POST"; wrk.headers["Content-Type"]="application/json"; local f=io.open("/tmp/zzbody.json"); wrk.body=f:read("*a"); f:close()`), 0o644)
	f, _ := os.Create("/tmp/zz.prof")
	pprof.StartCPUProfile(f)
	out, err := exec.Command("wrk", "-t2", "-c16", "-d6s", "-s", "/tmp/zz.lua", "http://"+srv.Addr()+"/v1/chat/completions").CombinedOutput()
	pprof.StopCPUProfile()
	t.Log(string(out), err)
}
