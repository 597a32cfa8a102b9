package members

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/adapter"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/fleet"
)

// fakeKube makes the Set's Kubernetes entries watch cs.
func fakeKube(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	old := KubeClients
	KubeClients = func(string) (kubernetes.Interface, dynamic.Interface, error) {
		dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
			map[schema.GroupVersionResource]string{discovery.InferencePools: "InferencePoolList"})
		return cs, dyn, nil
	}
	t.Cleanup(func() { KubeClients = old })
}

// kubeEndpoint is pod's endpoint at addr: ready, or terminating (still
// serving).
func kubeEndpoint(pod, addr string, ready bool) discoveryv1.Endpoint {
	r, term := ready, !ready
	return discoveryv1.Endpoint{Addresses: []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: &r, Serving: &term, Terminating: &term},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "llm", Name: pod}}
}

// live lists the fleet's backends that take new requests, by name@host.
func live(f *fleet.Fleet) map[string]*fleet.Backend {
	out := map[string]*fleet.Backend{}
	for _, b := range f.Snapshot().All {
		if !b.Draining() && !b.Retired() {
			out[b.Name+"@"+b.URL.Host] = b
		}
	}
	return out
}

// eventually waits for cond, which the watch makes true asynchronously;
// the bound only catches a hung watch.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for start := time.Now(); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("never: %s", what)
		}
	}
}

// TestKubePool: a discovery: kubernetes entry feeds the same membership
// path as a DNS pool. Endpoints listed at startup join without warm-up; a
// new ready endpoint joins warmed up with the entry's settings and the
// engine kind and role of its pod's labels; a terminating endpoint is
// drained, keeping its stream in flight, and retired once it ends; a pod
// restarting under its name at a new address comes back under that name
// to its slot, with its prefixes forgotten (its engine's cache is new).
func TestKubePool(t *testing.T) {
	ctx := context.Background()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "vllm-x", Namespace: "llm", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm", discoveryv1.LabelManagedBy: discovery.ManagedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: new(int32(8000))}},
		Endpoints:   []discoveryv1.Endpoint{kubeEndpoint("vllm-0", "10.0.0.1", true)},
	}
	cs := fake.NewClientset(slice, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vllm-1", Namespace: "llm",
		Labels: map[string]string{discovery.EngineLabel: "sglang", discovery.RoleLabel: "decode"}}})
	fakeKube(t, cs)
	c := config.Default()
	c.Fleet.Warmup = time.Hour
	c.Backends = []config.Backend{{Name: "vllm", Models: []string{"m"}, KVEvents: "5557",
		Kubernetes: &config.Kubernetes{Namespace: "llm", Service: "vllm"}}}
	s, f, forgot := newSet(t, c)
	runCtx, stop := context.WithCancel(ctx)
	defer func() { stop(); s.Wait() }()
	s.Start(runCtx)

	// Listed at startup: in the fleet when Start returns, at full weight.
	b0 := live(f)["llm/vllm-0@10.0.0.1:8000"]
	if b0 == nil || b0.WarmupWeight(time.Now()) != 1 {
		t.Fatalf("startup endpoint: %v (want llm/vllm-0 at full weight)", live(f))
	}
	if m := s.Of(b0); m.Entry.KVEndpoint(b0.URL.Hostname()) != "tcp://10.0.0.1:5557" || m.Pool != "vllm" {
		t.Errorf("vllm-0's record: pool %q, kv_events %q", m.Pool, m.Entry.KVEndpoint(b0.URL.Hostname()))
	}

	update := func(eps ...discoveryv1.Endpoint) {
		t.Helper()
		slice = slice.DeepCopy()
		slice.Endpoints = eps
		if _, err := cs.DiscoveryV1().EndpointSlices("llm").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// A new ready endpoint: warmed up, with its labels' kind and role.
	update(kubeEndpoint("vllm-0", "10.0.0.1", true), kubeEndpoint("vllm-1", "10.0.0.2", true))
	eventually(t, "vllm-1 joins", func() bool { return live(f)["llm/vllm-1@10.0.0.2:8000"] != nil })
	b1 := live(f)["llm/vllm-1@10.0.0.2:8000"]
	if w := b1.WarmupWeight(time.Now()); w >= 0.5 {
		t.Errorf("vllm-1 warm-up weight %v: a newcomer is not warmed up", w)
	}
	if m := s.Of(b1); m.Entry.EngineKind != adapter.SGLang || m.Entry.Role != "decode" || s.KindOf(b1) != adapter.SGLang {
		t.Errorf("vllm-1: kind %v, role %q; want sglang and decode from its labels", m.Entry.EngineKind, m.Entry.Role)
	}

	// vllm-0 terminates while a stream runs there: no new requests, the
	// stream goes on, and it retires when the stream ends.
	stream := b0.Start(10, 10, 10, time.Now())
	update(kubeEndpoint("vllm-0", "10.0.0.1", false), kubeEndpoint("vllm-1", "10.0.0.2", true))
	eventually(t, "vllm-0 drains", b0.Draining)
	if b0.Retired() || b0.Load().InFlight != 1 {
		t.Fatalf("terminating vllm-0 retired %v with %d in flight: its stream was cut", b0.Retired(), b0.Load().InFlight)
	}
	for _, b := range f.Snapshot().All {
		if b == b0 && !b.Draining() {
			t.Error("vllm-0 still takes new requests")
		}
	}
	stream.Done(time.Now())
	s.mu.Lock() // Forget runs on the watch's goroutine, under mu
	forgotten := slices.Clone(*forgot)
	s.mu.Unlock()
	// Retired, its prefixes kept through the rejoin grace (a pod that
	// only blinked out of the slice comes back to them).
	if !b0.Retired() || len(forgotten) != 0 {
		t.Errorf("after its stream: retired %v, forgotten %v; want retired, nothing forgotten within the grace", b0.Retired(), forgotten)
	}

	// vllm-0 restarts under its name at a new address.
	update(kubeEndpoint("vllm-1", "10.0.0.2", true), kubeEndpoint("vllm-0", "10.0.0.7", true))
	eventually(t, "vllm-0 is back", func() bool { return live(f)["llm/vllm-0@10.0.0.7:8000"] != nil })
	if got := s.ByName("llm/vllm-0"); got == nil || got.B.URL.Host != "10.0.0.7:8000" {
		t.Errorf("ByName(llm/vllm-0) = %v", got)
	} else if got.B.ID != b0.ID {
		t.Errorf("restarted vllm-0 took slot %d, want its own, %d", got.B.ID, b0.ID)
	}
	// At another address its engine started afresh: its prefixes go.
	s.mu.Lock()
	forgotten = slices.Clone(*forgot)
	s.mu.Unlock()
	if len(forgotten) != 1 || forgotten[0] != b0.ID {
		t.Errorf("restarted at another address: forgotten %v, want [%d]", forgotten, b0.ID)
	}

	// Removed from the slice: drained (idle, so retired at once).
	update(kubeEndpoint("vllm-0", "10.0.0.7", true))
	eventually(t, "vllm-1 leaves", func() bool { return b1.Retired() })
	if got := fmt.Sprint(len(live(f))); got != "1" {
		t.Errorf("%s live backends, want 1: %v", got, live(f))
	}
}

// TestKubeConfigReload: a reload that changes what an entry watches stops
// the old watch and drains its backends; the new one's join.
func TestKubeConfigReload(t *testing.T) {
	mk := func(name, svc, addr string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{
			ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "llm", Labels: map[string]string{discoveryv1.LabelServiceName: svc, discoveryv1.LabelManagedBy: discovery.ManagedBy}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Ports:       []discoveryv1.EndpointPort{{Port: new(int32(8000))}},
			Endpoints:   []discoveryv1.Endpoint{kubeEndpoint(svc+"-0", addr, true)},
		}
	}
	fakeKube(t, fake.NewClientset(mk("a-x", "a", "10.0.0.1"), mk("b-x", "b", "10.0.0.2")))
	c := config.Default()
	c.Backends = []config.Backend{{Name: "pool", Kubernetes: &config.Kubernetes{Namespace: "llm", Service: "a"}}}
	s, f, _ := newSet(t, c)
	ctx, stop := context.WithCancel(context.Background())
	defer func() { stop(); s.Wait() }()
	s.Start(ctx)
	if live(f)["llm/a-0@10.0.0.1:8000"] == nil {
		t.Fatalf("live %v", live(f))
	}
	c.Backends[0].Kubernetes = &config.Kubernetes{Namespace: "llm", Service: "b"}
	es, err := c.Entries()
	if err != nil {
		t.Fatal(err)
	}
	s.Apply(es, c.Fleet)
	if l := live(f); len(l) != 1 || l["llm/b-0@10.0.0.2:8000"] == nil {
		t.Errorf("after the reload: live %v, want only llm/b-0", l)
	}
}

// TestKubeModelsOutsideLock: ten new pods whose /v1/models never answer
// hold up no membership change: their models are asked for outside the
// set's lock, fetchAtOnce at a time, so a reload applies while all of
// them hang; once they answer, each joins with its models.
func TestKubeModelsOutsideLock(t *testing.T) {
	const pods = 10
	release := make(chan struct{})
	arrived := make(chan struct{}, pods)
	var mu sync.Mutex
	var now, most int
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			return
		}
		mu.Lock()
		now++
		most = max(most, now)
		mu.Unlock()
		arrived <- struct{}{}
		select { // hangs until the test lets it answer
		case <-release:
		case <-r.Context().Done():
		}
		mu.Lock()
		now--
		mu.Unlock()
		_, _ = w.Write([]byte(`{"data":[{"id":"m","max_model_len":4096}]}`))
	}))
	defer engine.Close()
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	defer let()
	u, _ := url.Parse(engine.URL)
	port, _ := strconv.Atoi(u.Port())

	ctx := context.Background()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "vllm-x", Namespace: "llm", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm", discoveryv1.LabelManagedBy: discovery.ManagedBy}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Port: new(int32(port))}},
	}
	cs := fake.NewClientset(slice)
	fakeKube(t, cs)
	c := config.Default()
	c.Health.Timeout = time.Hour // the fetches hang until released, not until a bound
	c.Backends = []config.Backend{{Name: "vllm", Kubernetes: &config.Kubernetes{Namespace: "llm", Service: "vllm"}}}
	es, err := c.Entries()
	if err != nil {
		t.Fatal(err)
	}
	f := fleet.New()
	s := New(Config{Fleet: f, Forget: func(int) {}, Transport: http.DefaultTransport, Health: c.Health,
		FleetSection: c.Fleet, DiscoverModels: true}, es)
	runCtx, stop := context.WithCancel(ctx)
	defer func() { stop(); let(); s.Wait() }()
	s.Start(runCtx)

	for i := range pods {
		slice.Endpoints = append(slice.Endpoints, kubeEndpoint(fmt.Sprintf("vllm-%d", i), "127.0.0.1", true))
	}
	if _, err := cs.DiscoveryV1().EndpointSlices("llm").Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// As many fetches as may run at once are hanging.
	for range fetchAtOnce {
		waitFor(t, "a /v1/models request", arrived)
	}
	// A reload (a static backend added) applies while they hang.
	static := httptest.NewServer(http.NotFoundHandler())
	defer static.Close()
	c.Backends = append(c.Backends, config.Backend{Name: "s0", URL: static.URL, Models: []string{"m"}})
	es, err = c.Entries()
	if err != nil {
		t.Fatal(err)
	}
	applied := make(chan struct{})
	go func() { s.Apply(es, c.Fleet); close(applied) }()
	waitFor(t, "the reload, while the pods' models hang", applied)
	if s.ByName("s0") == nil {
		t.Fatal("the reload's backend did not join")
	}
	let()
	eventually(t, "the ten pods join", func() bool { return len(live(f)) == pods+1 })
	for i := range pods {
		m := s.ByName(fmt.Sprintf("llm/vllm-%d", i))
		if m == nil || !slices.Equal(m.B.Models, []string{"m"}) {
			t.Errorf("pod %d: %v, want it serving its listed model m", i, m)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if most > fetchAtOnce {
		t.Errorf("%d /v1/models requests at once, want at most %d", most, fetchAtOnce)
	}
}

// waitFor waits for ch; the bound only catches a hang.
func waitFor[T any](t *testing.T, what string, ch <-chan T) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(30 * time.Second):
		t.Fatalf("never: %s", what)
	}
}
