package discovery

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Pod labels a Kubernetes source reads into an Endpoint.
const (
	// RoleLabel is a pod's role in disaggregated serving: prefill, decode
	// or both.
	RoleLabel = "kvroute.io/role"
	// EngineLabel is the engine a pod runs: vllm, sglang, llamacpp or tgi.
	EngineLabel = "kvroute.io/engine"
)

// InferencePools is the resource of the Gateway API inference extension's
// InferencePool (inference.networking.k8s.io/v1), read unstructured so that
// its module is not needed: only spec.selector.matchLabels and
// spec.targetPorts[].number are used.
var InferencePools = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// KubeSpec says what a Kubernetes source watches: in Namespace, the
// EndpointSlices of Service, or the pods matching Selector, or the pods an
// InferencePool's selector matches. Exactly one of the three is set.
type KubeSpec struct {
	Namespace     string
	Service       string
	Selector      map[string]string
	InferencePool string
	// Port is the port every endpoint is reached on: a number, or a name
	// (an EndpointSlice port's name; a pod's container port name). "" for
	// a Service: its slices' only port; for an InferencePool: its
	// targetPorts.
	Port string
	// Base gives every endpoint's URL its scheme and path.
	Base *url.URL
	// AllowLinkLocal lets endpoints at link-local addresses join
	// (169.254.0.0/16, fe80::/10): refused otherwise (ValidAddr).
	AllowLinkLocal bool
}

// ManagedBy is the EndpointSlice controller's value of the
// endpointslice.kubernetes.io/managed-by label (discoveryv1.LabelManagedBy):
// only the slices it keeps from the Service's selector are read, not any
// slice that claims the Service's name (anyone allowed to create
// EndpointSlices in the namespace could point the router anywhere).
const ManagedBy = "endpointslice-controller.k8s.io"

// Endpoint is one backend a Kubernetes source found ready for new
// requests.
type Endpoint struct {
	// Name is stable across a pod's restarts: namespace/pod (with
	// ":port" when an InferencePool lists several ports); an endpoint
	// without a pod reference is namespace/address.
	Name string
	URL  *url.URL
	// Role and Engine are the pod's RoleLabel and EngineLabel, "" when
	// it has none (not checked here).
	Role, Engine string
}

// Kube follows one KubeSpec through client-go informers. Its Endpoints are
// recomputed from the informers' caches on every call, so they are always
// the API server's latest word as far as the watch has seen it; Changed
// says when to ask again. An endpoint that is not ready, or terminating
// (an EndpointSlice's terminating condition, a pod's deletionTimestamp),
// is left out: its backend is then drained, not cut.
type Kube struct {
	spec      KubeSpec
	factories []interface{ Shutdown() }
	starts    []func(stop <-chan struct{})
	synced    []cache.InformerSynced
	slices    cache.Store // the Service's EndpointSlices; nil in the other modes
	pods      cache.Store // the namespace's pods (all of them, or Selector's)
	pools     cache.Store // the InferencePool; nil in the other modes
	changed   chan struct{}

	// Warn reports a problem with what the API server holds (a slice
	// without the port, a malformed InferencePool), once per distinct
	// message. Set it before Run; nil: not reported.
	Warn   func(msg string)
	warnMu sync.Mutex
	warned map[string]bool
}

// NewKube prepares the informers spec needs: EndpointSlices and pods for
// a Service (the pods for their labels), pods for a selector, the
// InferencePool (through dyn) and pods for a pool. Nothing runs before Run.
func NewKube(spec KubeSpec, cs kubernetes.Interface, dyn dynamic.Interface) *Kube {
	k := &Kube{spec: spec, changed: make(chan struct{}, 1), warned: map[string]bool{}}
	h := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { k.notify() },
		UpdateFunc: func(any, any) { k.notify() },
		DeleteFunc: func(any) { k.notify() },
	}
	typed := func(tweak func(*metav1.ListOptions)) informers.SharedInformerFactory {
		f := informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(spec.Namespace), informers.WithTweakListOptions(tweak))
		k.factories = append(k.factories, f)
		k.starts = append(k.starts, f.Start)
		return f
	}
	add := func(i cache.SharedIndexInformer) cache.Store {
		_, _ = i.AddEventHandler(h) // fails only once the informer has stopped
		k.synced = append(k.synced, i.HasSynced)
		return i.GetStore()
	}
	if spec.Service != "" {
		f := typed(func(o *metav1.ListOptions) {
			o.LabelSelector = labels.Set{discoveryv1.LabelServiceName: spec.Service, discoveryv1.LabelManagedBy: ManagedBy}.String()
		})
		k.slices = add(f.Discovery().V1().EndpointSlices().Informer())
	}
	podSelector := ""
	if len(spec.Selector) > 0 {
		podSelector = labels.SelectorFromSet(spec.Selector).String()
	}
	f := typed(func(o *metav1.ListOptions) { o.LabelSelector = podSelector })
	k.pods = add(f.Core().V1().Pods().Informer())
	if spec.InferencePool != "" {
		d := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, spec.Namespace, func(o *metav1.ListOptions) {
			o.FieldSelector = "metadata.name=" + spec.InferencePool
		})
		k.factories = append(k.factories, d)
		k.starts = append(k.starts, d.Start)
		k.pools = add(d.ForResource(InferencePools).Informer())
	}
	return k
}

// Run runs the informers until ctx is done and they have stopped.
func (k *Kube) Run(ctx context.Context) {
	for _, start := range k.starts {
		start(ctx.Done())
	}
	<-ctx.Done()
	for _, f := range k.factories {
		f.Shutdown()
	}
}

// WaitSynced waits until every informer has listed its objects once, or
// ctx is done; it reports whether they have.
func (k *Kube) WaitSynced(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), k.synced...)
}

// Changed receives a value after any watched object changed since the
// last receive (changes coalesce): call Endpoints then.
func (k *Kube) Changed() <-chan struct{} { return k.changed }

func (k *Kube) notify() {
	select {
	case k.changed <- struct{}{}:
	default:
	}
}

func (k *Kube) warn(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	k.warnMu.Lock()
	seen := k.warned[msg]
	k.warned[msg] = true
	k.warnMu.Unlock()
	if !seen && k.Warn != nil {
		k.Warn(msg)
	}
}

// Endpoints returns the endpoints ready for new requests, sorted by name.
func (k *Kube) Endpoints() []Endpoint {
	var out []Endpoint
	if k.slices != nil {
		out = k.sliceEndpoints()
	} else {
		out = k.podEndpoints()
	}
	slices.SortFunc(out, func(a, b Endpoint) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// sliceEndpoints reads the Service's EndpointSlices. An endpoint is ready
// unless its ready condition is false or its terminating condition true
// (nil ready means ready, nil terminating means not terminating); a pod in
// two slices (dual stack, or moving between slices) counts once, IPv4
// first, and is ready if any of its copies is.
func (k *Kube) sliceEndpoints() []Endpoint {
	all := k.slices.List()
	ss := make([]*discoveryv1.EndpointSlice, 0, len(all))
	for _, o := range all {
		s, ok := o.(*discoveryv1.EndpointSlice)
		if ok && s.Labels[discoveryv1.LabelServiceName] == k.spec.Service && s.Labels[discoveryv1.LabelManagedBy] == ManagedBy &&
			s.AddressType != discoveryv1.AddressTypeFQDN {
			ss = append(ss, s)
		}
	}
	slices.SortFunc(ss, func(a, b *discoveryv1.EndpointSlice) int {
		return strings.Compare(string(a.AddressType)+"/"+a.Name, string(b.AddressType)+"/"+b.Name)
	})
	seen := map[string]bool{}
	var out []Endpoint
	for _, s := range ss {
		port, ok := k.slicePort(s)
		if !ok {
			continue
		}
		for _, ep := range s.Endpoints {
			c := ep.Conditions
			if len(ep.Addresses) == 0 || (c.Ready != nil && !*c.Ready) || (c.Terminating != nil && *c.Terminating) {
				continue
			}
			name := k.spec.Namespace + "/" + ep.Addresses[0]
			var pod *corev1.Pod
			if r := ep.TargetRef; r != nil && r.Kind == "Pod" && r.Name != "" {
				name = k.spec.Namespace + "/" + r.Name
				if o, ok, _ := k.pods.GetByKey(name); ok {
					pod, _ = o.(*corev1.Pod)
				}
			}
			if seen[name] {
				continue
			}
			seen[name] = true
			if e, ok := k.endpoint(name, ep.Addresses[0], port, pod); ok {
				out = append(out, e)
			}
		}
	}
	return out
}

// slicePort returns the port of s that spec.Port names (s's only port
// when it names none).
func (k *Kube) slicePort(s *discoveryv1.EndpointSlice) (int, bool) {
	want := k.spec.Port
	n, numeric := strconv.Atoi(want)
	for _, p := range s.Ports {
		if p.Port == nil || (p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP) {
			continue
		}
		switch {
		case want == "" && len(s.Ports) == 1,
			numeric == nil && int(*p.Port) == n,
			numeric != nil && p.Name != nil && *p.Name == want:
			return int(*p.Port), true
		}
	}
	if want == "" {
		k.warn("kubernetes discovery: EndpointSlice %s/%s has %d ports; set port to choose one", s.Namespace, s.Name, len(s.Ports))
	} else {
		k.warn("kubernetes discovery: EndpointSlice %s/%s has no TCP port %s", s.Namespace, s.Name, want)
	}
	return 0, false
}

// podEndpoints reads the pods that the selector, or the InferencePool's,
// matches. A pod is ready when it runs, has an IP, is not being deleted
// and its Ready condition is true.
func (k *Kube) podEndpoints() []Endpoint {
	sel := labels.SelectorFromSet(k.spec.Selector)
	var ports []string
	if k.spec.Port != "" {
		ports = []string{k.spec.Port}
	}
	if k.pools != nil {
		var ok bool
		if sel, ports, ok = k.pool(); !ok {
			return nil
		}
	}
	var out []Endpoint
	for _, o := range k.pods.List() {
		pod, ok := o.(*corev1.Pod)
		if !ok || pod.Namespace != k.spec.Namespace || !sel.Matches(labels.Set(pod.Labels)) || !podReady(pod) {
			continue
		}
		for _, want := range ports {
			port, ok := podPort(pod, want)
			if !ok {
				k.warn("kubernetes discovery: pod %s/%s has no container port %s", pod.Namespace, pod.Name, want)
				continue
			}
			name := pod.Namespace + "/" + pod.Name
			if len(ports) > 1 {
				name += ":" + strconv.Itoa(port)
			}
			if e, ok := k.endpoint(name, pod.Status.PodIP, port, pod); ok {
				out = append(out, e)
			}
		}
	}
	return out
}

// pool reads the InferencePool's selector and target ports; false while it
// does not exist or is malformed (then no pod is selected: an empty
// selector would select every pod of the namespace).
func (k *Kube) pool() (labels.Selector, []string, bool) {
	o, ok, _ := k.pools.GetByKey(k.spec.Namespace + "/" + k.spec.InferencePool)
	if !ok {
		k.warn("kubernetes discovery: InferencePool %s/%s not found", k.spec.Namespace, k.spec.InferencePool)
		return nil, nil, false
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil, nil, false
	}
	where := "InferencePool " + k.spec.Namespace + "/" + k.spec.InferencePool
	match, _, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil || len(match) == 0 {
		k.warn("kubernetes discovery: %s: spec.selector.matchLabels is empty or malformed (%v)", where, err)
		return nil, nil, false
	}
	tps, _, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	var ports []string
	for _, tp := range tps {
		m, _ := tp.(map[string]any)
		n, ok, _ := unstructured.NestedInt64(m, "number")
		if ok && n > 0 && n < 65536 {
			ports = append(ports, strconv.FormatInt(n, 10))
		}
	}
	if err != nil || len(ports) == 0 {
		k.warn("kubernetes discovery: %s: spec.targetPorts has no port number (%v)", where, err)
		return nil, nil, false
	}
	return labels.SelectorFromSet(match), ports, true
}

func podReady(p *corev1.Pod) bool {
	if p.DeletionTimestamp != nil || p.Status.PodIP == "" || p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podPort resolves want, a number or a container port's name, on p.
func podPort(p *corev1.Pod, want string) (int, bool) {
	if n, err := strconv.Atoi(want); err == nil {
		return n, true
	}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == want && (cp.Protocol == "" || cp.Protocol == corev1.ProtocolTCP) {
				return int(cp.ContainerPort), true
			}
		}
	}
	return 0, false
}

// endpoint is the backend at addr:port; false, with a warning, when the
// address or port is not one a backend may have (ValidAddr).
func (k *Kube) endpoint(name, addr string, port int, pod *corev1.Pod) (Endpoint, bool) {
	a, err := ValidAddr(addr, port, k.spec.AllowLinkLocal)
	if err != nil {
		k.warn("kubernetes discovery: endpoint %s refused: %v", name, err)
		return Endpoint{}, false
	}
	u := *k.spec.Base
	u.Host = netip.AddrPortFrom(a, uint16(port)).String()
	e := Endpoint{Name: name, URL: &u}
	if pod != nil {
		e.Role, e.Engine = pod.Labels[RoleLabel], pod.Labels[EngineLabel]
	}
	return e, true
}

// ValidAddr checks an endpoint's address and port as the API server gave
// them: an IP literal without a zone (no host name, nothing that would
// change the URL's meaning), a port in 1-65535, and neither the
// unspecified address (0.0.0.0, ::: the router's own host) nor, unless
// allowLinkLocal, a link-local one (169.254.169.254 is the cloud's
// metadata service). An IPv4-mapped IPv6 address is read as IPv4.
func ValidAddr(addr string, port int, allowLinkLocal bool) (netip.Addr, error) {
	a, err := netip.ParseAddr(addr)
	switch {
	case err != nil:
		return netip.Addr{}, fmt.Errorf("address %q is not an IP literal", addr)
	case a.Zone() != "":
		return netip.Addr{}, fmt.Errorf("address %q has a zone", addr)
	case port < 1 || port > 65535:
		return netip.Addr{}, fmt.Errorf("port %d is not in 1-65535", port)
	}
	a = a.Unmap()
	switch {
	case a.IsUnspecified():
		return netip.Addr{}, fmt.Errorf("address %s is unspecified", a)
	case !allowLinkLocal && (a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast()):
		return netip.Addr{}, fmt.Errorf("address %s is link-local (kubernetes.allow_link_local)", a)
	}
	return a, nil
}

// KubeClients returns the API clients of a Kubernetes source: from the
// kubeconfig file at path, or, with path "", the in-cluster config (the
// pod's service account).
func KubeClients(path string) (kubernetes.Interface, dynamic.Interface, error) {
	var c *rest.Config
	var err error
	if path == "" {
		c, err = rest.InClusterConfig()
	} else {
		c, err = clientcmd.BuildConfigFromFlags("", path)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(c)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	return cs, dyn, nil
}

// InClusterNamespace is the namespace of the pod the router runs in, from
// its service account; "" outside a cluster.
func InClusterNamespace() string {
	b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
