package discovery

import (
	"context"
	"errors"
	"net"
	"net/url"
	"slices"
	"strings"
	"testing"
)

func TestResolve(t *testing.T) {
	stub := Funcs{
		IPAddr: func(_ context.Context, host string) ([]net.IPAddr, error) {
			switch host {
			case "pool":
				return []net.IPAddr{{IP: net.ParseIP("10.0.0.2")}, {IP: net.ParseIP("10.0.0.1")}, {IP: net.ParseIP("fd00::1")}, {IP: net.ParseIP("10.0.0.1")}}, nil
			case "empty":
				return nil, nil
			}
			return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
		},
		SRV: func(_ context.Context, service, proto, name string) (string, []*net.SRV, error) {
			if service != "" || proto != "" || name != "_http._tcp.vllm" {
				return "", nil, errors.New("unexpected SRV query " + service + proto + name)
			}
			return name, []*net.SRV{{Target: "b.vllm.", Port: 8001}, {Target: "a.vllm.", Port: 8000}, {Target: ".", Port: 1}}, nil
		},
	}
	tests := []struct {
		name, base, srv string
		want            []string
		wantErr         string
	}{
		{"A and AAAA, sorted, deduplicated", "http://pool:8000/v", "", []string{"http://10.0.0.1:8000/v", "http://10.0.0.2:8000/v", "http://[fd00::1]:8000/v"}, ""},
		{"default port", "https://empty", "", []string{}, ""},
		{"not found", "http://gone:1", "", nil, "resolve gone"},
		{"SRV", "https://vllm", "_http._tcp.vllm", []string{"https://a.vllm:8000", "https://b.vllm:8001"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base, _ := url.Parse(tt.base)
			got, err := Resolve(context.Background(), stub, base, tt.srv)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s := []string{}
			for _, u := range got {
				s = append(s, u.String())
			}
			if !slices.Equal(s, tt.want) {
				t.Fatalf("got %v, want %v", s, tt.want)
			}
		})
	}
}
