package discovery

import (
	"context"
	"encoding/json"
	"net/netip"
	"net/url"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
)

const ns = "llm"

// Fixtures: a Service's EndpointSlice, its endpoints, pods and an
// InferencePool, as the API server holds them.

func ptr[T any](v T) *T { return &v }

// sliceEndpoint is an endpoint of pod at addr with the given conditions
// (nil: unset).
func sliceEndpoint(pod, addr string, ready, serving, terminating *bool) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: ready, Serving: serving, Terminating: terminating}}
	if pod != "" {
		e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod}
	}
	return e
}

func endpointSlice(name, service string, typ discoveryv1.AddressType, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: service, discoveryv1.LabelManagedBy: ManagedBy}},
		AddressType: typ, Ports: ports, Endpoints: eps,
	}
}

func httpPort(name string, n int32) discoveryv1.EndpointPort {
	return discoveryv1.EndpointPort{Name: ptr(name), Port: ptr(n), Protocol: ptr(corev1.ProtocolTCP)}
}

// pod is a running pod at ip with labels; ready sets its Ready condition.
func pod(name, ip string, ready bool, lbls map[string]string) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbls},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8000}}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

func inferencePool(name string, match map[string]any, port int64) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1",
		"kind":       "InferencePool",
		"metadata":   map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{
			"selector":          map[string]any{"matchLabels": match},
			"targetPorts":       []any{map[string]any{"number": port}},
			"endpointPickerRef": map[string]any{"name": "epp"},
		},
	}}
}

func fakeDynamic(objs ...runtime.Object) *dynamicfake.FakeDynamicClient {
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{InferencePools: "InferencePoolList"}, objs...)
}

// watch runs a Kube over the fake clients until the test ends and waits
// for its first listing.
func watch(t *testing.T, spec KubeSpec, cs kubernetes.Interface, dyn *dynamicfake.FakeDynamicClient) *Kube {
	t.Helper()
	if spec.Base == nil {
		spec.Base = &url.URL{Scheme: "http", Path: "/"}
	}
	spec.Namespace = ns
	if dyn == nil {
		dyn = fakeDynamic()
	}
	k := NewKube(spec, cs, dyn)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { k.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	if !k.WaitSynced(ctx) {
		t.Fatal("informers did not sync")
	}
	return k
}

// names lists eps as name@host plus role and engine where set.
func names(eps []Endpoint) []string {
	out := []string{}
	for _, e := range eps {
		s := e.Name + "@" + e.URL.Host
		if e.Role != "" || e.Engine != "" {
			s += "[" + e.Role + "," + e.Engine + "]"
		}
		out = append(out, s)
	}
	return out
}

// await waits (on the watch's own signal, not a clock) until k's
// endpoints are want; the fake's events arrive asynchronously.
func await(t *testing.T, k *Kube, want ...string) {
	t.Helper()
	if want == nil {
		want = []string{}
	}
	deadline := time.After(30 * time.Second) // only a hung watch reaches it
	for {
		got := names(k.Endpoints())
		if slices.Equal(got, want) {
			return
		}
		select {
		case <-k.Changed():
		case <-deadline:
			t.Fatalf("endpoints %q, want %q", got, want)
		}
	}
}

// TestKubeServiceSlices: an EndpointSlice's endpoints are backends when
// ready and not terminating (nil conditions meaning ready and not
// terminating); a not-ready or terminating (still serving) one is left out;
// a pod listed in an IPv4 and an IPv6 slice counts once; the port is
// chosen by name; the pods' labels give role and engine.
func TestKubeServiceSlices(t *testing.T) {
	ports := []discoveryv1.EndpointPort{httpPort("metrics", 9000), httpPort("http", 8000)}
	cs := fake.NewClientset(
		endpointSlice("vllm-abc", "vllm", discoveryv1.AddressTypeIPv4, ports,
			sliceEndpoint("vllm-0", "10.0.0.1", ptr(true), ptr(true), ptr(false)),
			sliceEndpoint("vllm-1", "10.0.0.2", nil, nil, nil),
			sliceEndpoint("vllm-2", "10.0.0.3", ptr(false), ptr(true), ptr(true)),   // terminating
			sliceEndpoint("vllm-3", "10.0.0.4", ptr(false), ptr(false), ptr(false)), // not ready
			sliceEndpoint("", "10.0.0.9", ptr(true), nil, nil),                      // no pod
		),
		endpointSlice("vllm-v6", "vllm", discoveryv1.AddressTypeIPv6, ports,
			sliceEndpoint("vllm-0", "fd00::1", ptr(true), ptr(true), ptr(false))),
		endpointSlice("other", "sglang", discoveryv1.AddressTypeIPv4, ports,
			sliceEndpoint("sglang-0", "10.0.1.1", ptr(true), nil, nil)),
		pod("vllm-0", "10.0.0.1", true, map[string]string{RoleLabel: "prefill", EngineLabel: "vllm"}),
	)
	k := watch(t, KubeSpec{Service: "vllm", Port: "http"}, cs, nil)
	await(t, k, "llm/10.0.0.9@10.0.0.9:8000", "llm/vllm-0@10.0.0.1:8000[prefill,vllm]", "llm/vllm-1@10.0.0.2:8000")
}

// TestKubeSliceLifecycle: the watch follows an endpoint as it is added,
// becomes ready, turns terminating and is removed; a pod that restarts
// under its name at a new address keeps its name.
func TestKubeSliceLifecycle(t *testing.T) {
	ctx := context.Background()
	ports := []discoveryv1.EndpointPort{httpPort("", 8000)}
	s := endpointSlice("vllm-abc", "vllm", discoveryv1.AddressTypeIPv4, ports,
		sliceEndpoint("vllm-0", "10.0.0.1", ptr(true), ptr(true), ptr(false)))
	cs := fake.NewClientset(s)
	k := watch(t, KubeSpec{Service: "vllm"}, cs, nil)
	await(t, k, "llm/vllm-0@10.0.0.1:8000")
	update := func(eps ...discoveryv1.Endpoint) {
		t.Helper()
		s = s.DeepCopy()
		s.Endpoints = eps
		if _, err := cs.DiscoveryV1().EndpointSlices(ns).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name string
		eps  []discoveryv1.Endpoint
		want []string
	}{
		{"added, not ready yet", []discoveryv1.Endpoint{sliceEndpoint("vllm-0", "10.0.0.1", ptr(true), nil, nil), sliceEndpoint("vllm-1", "10.0.0.2", ptr(false), ptr(false), ptr(false))},
			[]string{"llm/vllm-0@10.0.0.1:8000"}},
		{"ready", []discoveryv1.Endpoint{sliceEndpoint("vllm-0", "10.0.0.1", ptr(true), nil, nil), sliceEndpoint("vllm-1", "10.0.0.2", ptr(true), ptr(true), ptr(false))},
			[]string{"llm/vllm-0@10.0.0.1:8000", "llm/vllm-1@10.0.0.2:8000"}},
		{"terminating", []discoveryv1.Endpoint{sliceEndpoint("vllm-0", "10.0.0.1", ptr(false), ptr(true), ptr(true)), sliceEndpoint("vllm-1", "10.0.0.2", ptr(true), nil, nil)},
			[]string{"llm/vllm-1@10.0.0.2:8000"}},
		{"removed", []discoveryv1.Endpoint{sliceEndpoint("vllm-1", "10.0.0.2", ptr(true), nil, nil)},
			[]string{"llm/vllm-1@10.0.0.2:8000"}},
		{"restarted at a new address", []discoveryv1.Endpoint{sliceEndpoint("vllm-1", "10.0.0.2", ptr(true), nil, nil), sliceEndpoint("vllm-0", "10.0.0.7", ptr(true), nil, nil)},
			[]string{"llm/vllm-0@10.0.0.7:8000", "llm/vllm-1@10.0.0.2:8000"}},
	}
	for _, st := range steps {
		update(st.eps...)
		t.Log(st.name)
		await(t, k, st.want...)
	}
	if err := cs.DiscoveryV1().EndpointSlices(ns).Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, k)
}

// TestKubePodSelector: pods matching the selector are backends while they
// run, have an IP, are Ready and not being deleted; a named container
// port resolves per pod.
func TestKubePodSelector(t *testing.T) {
	ctx := context.Background()
	sel := map[string]string{"app": "vllm"}
	notRunning := pod("vllm-2", "10.0.0.3", true, sel)
	notRunning.Status.Phase = corev1.PodPending
	cs := fake.NewClientset(
		pod("vllm-0", "10.0.0.1", true, map[string]string{"app": "vllm", EngineLabel: "sglang", RoleLabel: "decode"}),
		pod("vllm-1", "10.0.0.2", false, sel),
		notRunning,
		pod("other", "10.0.0.9", true, map[string]string{"app": "tgi"}),
	)
	k := watch(t, KubeSpec{Selector: sel, Port: "http"}, cs, nil)
	await(t, k, "llm/vllm-0@10.0.0.1:8000[decode,sglang]")

	p := pod("vllm-1", "10.0.0.2", true, sel)
	if _, err := cs.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, k, "llm/vllm-0@10.0.0.1:8000[decode,sglang]", "llm/vllm-1@10.0.0.2:8000")

	p = p.DeepCopy()
	p.DeletionTimestamp = ptr(metav1.Now())
	if _, err := cs.CoreV1().Pods(ns).Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, k, "llm/vllm-0@10.0.0.1:8000[decode,sglang]")
}

// TestKubeInferencePool: the pool's selector picks the pods and its
// targetPorts their port; changing the selector changes the backends, and
// a pool that is gone (or has no selector) selects nothing rather than
// every pod.
func TestKubeInferencePool(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset(
		pod("a-0", "10.0.0.1", true, map[string]string{"pool": "a"}),
		pod("b-0", "10.0.0.2", true, map[string]string{"pool": "b"}),
	)
	dyn := fakeDynamic(inferencePool("chat", map[string]any{"pool": "a"}, 8001), inferencePool("other", map[string]any{"pool": "b"}, 8002))
	k := watch(t, KubeSpec{InferencePool: "chat"}, cs, dyn)
	var warned []string
	k.Warn = func(m string) { warned = append(warned, m) }
	await(t, k, "llm/a-0@10.0.0.1:8001")

	pools := dyn.Resource(InferencePools).Namespace(ns)
	if _, err := pools.Update(ctx, inferencePool("chat", map[string]any{"pool": "b"}, 8003), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, k, "llm/b-0@10.0.0.2:8003")

	if _, err := pools.Update(ctx, inferencePool("chat", map[string]any{}, 8003), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, k)
	if err := pools.Delete(ctx, "chat", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, k)
	if len(warned) == 0 {
		t.Error("a pool without a selector was not reported")
	}
}

// FuzzInferencePool: whatever an InferencePool object holds (it is read
// unstructured, as the API server returns it), reading the endpoints does
// not panic, and a pool selects pods only through a non-empty selector.
func FuzzInferencePool(f *testing.F) {
	f.Add([]byte(`{"spec":{"selector":{"matchLabels":{"pool":"a"}},"targetPorts":[{"number":8000}]}}`))
	f.Add([]byte(`{"spec":{"selector":{"matchLabels":{}},"targetPorts":[{"number":8000},{"number":"x"}]}}`))
	f.Add([]byte(`{"spec":{"selector":"pool=a","targetPorts":{"number":1}}}`))
	f.Add([]byte(`{"spec":{"selector":{"matchLabels":{"pool":7}},"targetPorts":[{"number":1e30}]}}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		var obj map[string]any
		if json.Unmarshal(doc, &obj) != nil {
			return
		}
		u := &unstructured.Unstructured{Object: obj}
		u.SetNamespace(ns)
		u.SetName("chat")
		pools := cache.NewStore(cache.MetaNamespaceKeyFunc)
		pods := cache.NewStore(cache.MetaNamespaceKeyFunc)
		if pools.Add(u) != nil || pods.Add(pod("a-0", "10.0.0.1", true, map[string]string{"pool": "a"})) != nil ||
			pods.Add(pod("none", "10.0.0.2", true, nil)) != nil {
			t.Fatal("store add")
		}
		k := &Kube{spec: KubeSpec{Namespace: ns, InferencePool: "chat", Base: &url.URL{Scheme: "http"}}, pools: pools, pods: pods, warned: map[string]bool{}}
		for _, e := range k.Endpoints() {
			if e.Name == ns+"/none" {
				t.Fatalf("a pod without labels was selected by %s", doc)
			}
		}
	})
}

// TestKubeEndpointsValidated: the API server's endpoints were taken as
// they came: 169.254.169.254, 0.0.0.0, "not-an-ip:99/x?y", ports 0, 65536
// and -1 all became backends, and a slice that named the Service but was
// not the EndpointSlice controller's was read too. Only IP literals, ports
// 1-65535 and the controller's slices are; link-local addresses only under
// allow_link_local.
func TestKubeEndpointsValidated(t *testing.T) {
	port := func(n int32) []discoveryv1.EndpointPort { return []discoveryv1.EndpointPort{httpPort("http", n)} }
	forged := endpointSlice("forged", "vllm", discoveryv1.AddressTypeIPv4, port(8000), sliceEndpoint("", "10.6.6.6", nil, nil, nil))
	forged.Labels[discoveryv1.LabelManagedBy] = "someone-else"
	objs := []runtime.Object{
		endpointSlice("v4", "vllm", discoveryv1.AddressTypeIPv4, port(8000),
			sliceEndpoint("", "10.0.0.5", nil, nil, nil),
			sliceEndpoint("", "169.254.169.254", nil, nil, nil),
			sliceEndpoint("", "0.0.0.0", nil, nil, nil),
			sliceEndpoint("", "not-an-ip:99/x?y", nil, nil, nil),
			sliceEndpoint("", "::ffff:0.0.0.0", nil, nil, nil)),
		endpointSlice("v6", "vllm", discoveryv1.AddressTypeIPv6, port(8000),
			sliceEndpoint("", "fe80::1", nil, nil, nil),
			sliceEndpoint("", "fe80::2%eth0", nil, nil, nil),
			sliceEndpoint("", "::", nil, nil, nil)),
		endpointSlice("port-0", "vllm", discoveryv1.AddressTypeIPv4, port(0), sliceEndpoint("", "10.0.2.1", nil, nil, nil)),
		endpointSlice("port-65536", "vllm", discoveryv1.AddressTypeIPv4, port(65536), sliceEndpoint("", "10.0.2.2", nil, nil, nil)),
		endpointSlice("port-neg", "vllm", discoveryv1.AddressTypeIPv4, port(-1), sliceEndpoint("", "10.0.2.3", nil, nil, nil)),
		forged,
	}
	k := watch(t, KubeSpec{Service: "vllm"}, fake.NewClientset(objs...), nil)
	await(t, k, "llm/10.0.0.5@10.0.0.5:8000")
	k = watch(t, KubeSpec{Service: "vllm", AllowLinkLocal: true}, fake.NewClientset(objs...), nil)
	await(t, k, "llm/10.0.0.5@10.0.0.5:8000", "llm/169.254.169.254@169.254.169.254:8000", "llm/fe80::1@[fe80::1]:8000")
}

// TestValidAddr: the address and port rules, one case each.
func TestValidAddr(t *testing.T) {
	for _, tt := range []struct {
		addr      string
		port      int
		linkLocal bool
		ok        bool
	}{
		{"10.0.0.1", 8000, false, true},
		{"fd00::1", 1, false, true},
		{"10.0.0.1", 65535, false, true},
		{"10.0.0.1", 0, false, false},
		{"10.0.0.1", 65536, false, false},
		{"10.0.0.1", -1, false, false},
		{"vllm.example", 8000, false, false},
		{"10.0.0.1:80", 8000, false, false},
		{"", 8000, false, false},
		{"0.0.0.0", 8000, true, false},
		{"::", 8000, true, false},
		{"::ffff:169.254.169.254", 8000, false, false},
		{"169.254.169.254", 8000, false, false},
		{"169.254.169.254", 8000, true, true},
		{"fe80::1", 8000, false, false},
		{"fe80::1%eth0", 8000, true, false},
	} {
		if _, err := ValidAddr(tt.addr, tt.port, tt.linkLocal); (err == nil) != tt.ok {
			t.Errorf("ValidAddr(%q, %d, %v): %v, want ok %v", tt.addr, tt.port, tt.linkLocal, err, tt.ok)
		}
	}
}

// FuzzValidAddr: whatever address and port the API server holds, ValidAddr
// does not panic, and an address it accepts makes a URL host that reads
// back as the same address and port.
func FuzzValidAddr(f *testing.F) {
	for _, s := range []string{"10.0.0.1", "fd00::1", "169.254.169.254", "0.0.0.0", "not-an-ip:99/x?y", "fe80::1%eth0", "::ffff:10.0.0.1", ""} {
		f.Add(s, 8000, false)
	}
	f.Fuzz(func(t *testing.T, addr string, port int, linkLocal bool) {
		a, err := ValidAddr(addr, port, linkLocal)
		if err != nil {
			return
		}
		host := netip.AddrPortFrom(a, uint16(port)).String()
		u, perr := url.Parse("http://" + host + "/")
		if perr != nil || u.Host != host {
			t.Fatalf("%q -> host %q: %v", addr, host, perr)
		}
		back, perr := netip.ParseAddrPort(u.Host)
		if perr != nil || back.Addr() != a || int(back.Port()) != port {
			t.Fatalf("%q:%d -> %q reads back as %v (%v)", addr, port, host, back, perr)
		}
	})
}
