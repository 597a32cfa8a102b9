package config

import (
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Kubernetes is what a backends[] entry with discovery: kubernetes watches
// in the Kubernetes API, in one namespace: the EndpointSlices of a Service,
// the pods matching a label selector, or the pods an InferencePool
// (inference.networking.k8s.io/v1) selects. Set exactly one of Service,
// Selector and InferencePool. Every endpoint found ready is a backend with
// the entry's settings (models, kind, kv_events, TLS, limits); one that
// turns terminating or not ready is drained; a newcomer is warmed up. A
// pod's labels kvroute.io/engine and kvroute.io/role set its backend's
// engine kind and role. The router needs get, list and watch on the
// resources it reads (docs/deploy.md).
type Kubernetes struct {
	// Namespace to watch. Default "": the namespace the router runs in
	// (its service account's).
	Namespace string `yaml:"namespace"`
	// Service is a Service whose EndpointSlices (discovery.k8s.io/v1)
	// list the backends: ready endpoints join, terminating ones drain.
	Service string `yaml:"service"`
	// Selector is a set of pod labels (matchLabels): every ready pod that
	// has them all is a backend.
	Selector map[string]string `yaml:"selector"`
	// InferencePool is an InferencePool whose spec.selector picks the
	// pods and whose spec.targetPorts gives their port; a change of its
	// selector changes the backends.
	InferencePool string `yaml:"inference_pool"`
	// Port is the port the backends are reached on: a number, or a name
	// (the EndpointSlice port's name, for a Service; a container port's
	// name, for a selector). Required with selector; with service,
	// default: the slices' only port; with inference_pool it must be
	// left out (targetPorts gives it).
	Port string `yaml:"port"`
	// Kubeconfig is a kubeconfig file to reach the API server with, for a
	// router running outside the cluster. Default "": the in-cluster
	// config (the pod's service account).
	Kubeconfig string `yaml:"kubeconfig"`
	// AllowLinkLocal lets endpoints at link-local addresses
	// (169.254.0.0/16, fe80::/10) become backends. Default false: they are
	// refused, as are addresses that are not IP literals, the unspecified
	// address and ports outside 1-65535, whatever the API server holds.
	AllowLinkLocal bool `yaml:"allow_link_local"`
}

// portName is an IANA service name, the form of a Kubernetes port's name.
var portName = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,13}[a-z0-9])?$`)

// labelKey and labelValue are the forms of a label's key (with its
// optional DNS prefix) and of its value.
var (
	labelKey   = regexp.MustCompile(`^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	labelValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
	objectName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$`)
)

func (k *Kubernetes) validate(where string, bad func(string, ...any)) {
	if k == nil {
		return
	}
	set := 0
	if k.Service != "" {
		set++
	}
	if len(k.Selector) > 0 {
		set++
	}
	if k.InferencePool != "" {
		set++
	}
	if set != 1 {
		bad("%s: set exactly one of service, selector and inference_pool", where)
	}
	if k.Namespace != "" && !objectName.MatchString(k.Namespace) {
		bad("%s.namespace: %q is not a namespace name", where, k.Namespace)
	}
	for _, n := range []struct{ key, v string }{{"service", k.Service}, {"inference_pool", k.InferencePool}} {
		if n.v != "" && !objectName.MatchString(n.v) {
			bad("%s.%s: %q is not an object name", where, n.key, n.v)
		}
	}
	for _, key := range slices.Sorted(maps.Keys(k.Selector)) {
		if len(key) > 317 || !labelKey.MatchString(key) || !labelValue.MatchString(k.Selector[key]) {
			bad("%s.selector: %q: %q is not a label key and value", where, key, k.Selector[key])
		}
	}
	if k.Port != "" {
		if n, err := strconv.Atoi(k.Port); err == nil {
			if n < 1 || n > 65535 {
				bad("%s.port: %d is not a port number", where, n)
			}
		} else if !portName.MatchString(k.Port) || !strings.ContainsAny(k.Port, "abcdefghijklmnopqrstuvwxyz") {
			bad("%s.port: %q is not a port number or name", where, k.Port)
		}
	}
	if len(k.Selector) > 0 && k.Port == "" {
		bad("%s.port: required with selector", where)
	}
	if k.InferencePool != "" && k.Port != "" {
		bad("%s.port: leave it out with inference_pool (its targetPorts give the port)", where)
	}
}

// key is the section as part of its entry's Key.
func (k *Kubernetes) key() string {
	if k == nil {
		return ""
	}
	sel := make([]string, 0, len(k.Selector))
	for _, key := range slices.Sorted(maps.Keys(k.Selector)) {
		sel = append(sel, key+"="+k.Selector[key])
	}
	return strings.Join([]string{k.Namespace, k.Service, strings.Join(sel, ","), k.InferencePool, k.Port, k.Kubeconfig, strconv.FormatBool(k.AllowLinkLocal)}, "\x01")
}

// host names the entry in logs and metrics when it has no url: the
// Service's or pool's in-cluster name, or "pods" with the selector.
func (k *Kubernetes) host() string {
	name := k.Service
	if name == "" {
		name = k.InferencePool
	}
	if name == "" {
		name = "pods"
	}
	if k.Namespace != "" {
		name += "." + k.Namespace
	}
	return name
}
