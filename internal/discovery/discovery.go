// Package discovery finds backends. Resolve turns a DNS name into backend
// base URLs: every A/AAAA address of a name on the URL's port, or every
// target and port of an SRV record, so that a Kubernetes headless service
// works as a backend pool. Kube (kube.go) follows the Kubernetes API
// through client-go informers: a Service's EndpointSlices, pods by label,
// or an InferencePool's pods, and says which endpoints are ready for new
// requests, with each pod's stable name and its role and engine labels.
//
// It only finds: it knows nothing of the fleet and keeps no state beyond
// the informers' caches. Package members adds the backends it finds and
// drains those it no longer reports.
package discovery

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// Resolver is the part of *net.Resolver discovery uses.
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
	LookupSRV(ctx context.Context, service, proto, name string) (cname string, addrs []*net.SRV, err error)
}

// Funcs is a Resolver made of plain functions; tests use it to stub DNS.
type Funcs struct {
	IPAddr func(ctx context.Context, host string) ([]net.IPAddr, error)
	SRV    func(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

// LookupIPAddr calls f.IPAddr.
func (f Funcs) LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error) {
	return f.IPAddr(ctx, host)
}

// LookupSRV calls f.SRV.
func (f Funcs) LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error) {
	return f.SRV(ctx, service, proto, name)
}

var _ Resolver = (*net.Resolver)(nil)
var _ Resolver = Funcs{}

// Resolve returns the base URLs behind base: with srv "", one per A/AAAA
// address of base's host on base's port (the scheme's default port when
// it has none); else one per target and port of the SRV record srv (a
// full name such as _http._tcp.vllm.ns.svc.cluster.local). Scheme and
// path come from base. The result is sorted and free of duplicates; an
// error means nothing is known, which is not the same as an empty pool.
func Resolve(ctx context.Context, r Resolver, base *url.URL, srv string) ([]*url.URL, error) {
	var hosts []string
	if srv != "" {
		_, recs, err := r.LookupSRV(ctx, "", "", srv)
		if err != nil {
			return nil, fmt.Errorf("resolve SRV %s: %w", srv, err)
		}
		for _, rec := range recs {
			t := strings.TrimSuffix(rec.Target, ".")
			if t == "" {
				continue // "." means the service is decidedly not available
			}
			hosts = append(hosts, net.JoinHostPort(t, strconv.Itoa(int(rec.Port))))
		}
	} else {
		port := base.Port()
		if port == "" {
			port = "80"
			if base.Scheme == "https" {
				port = "443"
			}
		}
		ips, err := r.LookupIPAddr(ctx, base.Hostname())
		if err != nil {
			return nil, fmt.Errorf("resolve %s: %w", base.Hostname(), err)
		}
		for _, ip := range ips {
			hosts = append(hosts, net.JoinHostPort(ip.String(), port))
		}
	}
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	out := make([]*url.URL, 0, len(hosts))
	for _, h := range hosts {
		u := *base
		u.Host = h
		out = append(out, &u)
	}
	return out, nil
}
