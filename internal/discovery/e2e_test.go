package discovery_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"

	"github.com/kvroute/kvroute/internal/clocktest"
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/emulator"
	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/fleet"
	"github.com/kvroute/kvroute/internal/members"
	"github.com/kvroute/kvroute/internal/server"
)

// The end-to-end test runs a real API server (kube-apiserver over etcd) on
// loopback, a kvroute router watching it with a least-privilege Role, and
// emulated engines the EndpointSlices point at. It needs the binaries:
//
//	KVROUTE_KUBE_APISERVER  path of kube-apiserver (else $KUBEBUILDER_ASSETS/kube-apiserver)
//	KVROUTE_ETCD            path of etcd (else $KUBEBUILDER_ASSETS/etcd, else etcd on $PATH)
//
// and skips, saying so, without them.

const (
	adminToken  = "kvroute-e2e-admin"
	routerToken = "kvroute-e2e-router"
	e2eNS       = "llm"
)

func binary(t *testing.T, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	if d := os.Getenv("KUBEBUILDER_ASSETS"); d != "" {
		if p := filepath.Join(d, name); fileExists(p) {
			return p
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	t.Skipf("no %s: set %s (or KUBEBUILDER_ASSETS) to run the end-to-end test against a real API server (docs/benchmarks.md says how one is built)", name, env)
	return ""
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// run starts a process that is killed when the test ends; its output
// goes to a log file that is shown if the test fails.
func run(t *testing.T, dir, name string, bin string, args ...string) {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	out, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		out.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s log (tail):\n%s", name, b)
		}
	})
}

// controlPlane starts etcd and kube-apiserver (RBAC on, two static
// tokens: an admin and the router's user "kvroute") and returns the
// admin's client and the API server's URL.
func controlPlane(t *testing.T) (*kubernetes.Clientset, string) {
	t.Helper()
	api := binary(t, "KVROUTE_KUBE_APISERVER", "kube-apiserver")
	etcd := binary(t, "KVROUTE_ETCD", "etcd")
	dir := t.TempDir()
	client, peer, secure := freePort(t), freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", client)
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", peer)
	run(t, dir, "etcd", etcd, "--data-dir", filepath.Join(dir, "etcd"), "--name", "e2e",
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "e2e="+peerURL, "--unsafe-no-fsync")

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	keyPath := filepath.Join(dir, "sa.key")
	tokens := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokens, []byte(adminToken+",admin,1,system:masters\n"+routerToken+",kvroute,2\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	run(t, dir, "kube-apiserver", api, "--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", strconv.Itoa(secure),
		"--cert-dir", filepath.Join(dir, "certs"), "--token-auth-file", tokens, "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc", "--service-account-key-file", keyPath,
		"--service-account-signing-key-file", keyPath, "--service-cluster-ip-range", "10.96.0.0/24",
		"--disable-admission-plugins", "ServiceAccount", "--enable-priority-and-fairness=false",
		"--endpoint-reconciler-type", "none") // no kubernetes Service: its address would be loopback
	host := fmt.Sprintf("https://127.0.0.1:%d", secure)

	// Ready: /readyz answers 200. The bound only catches a server that
	// never starts.
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		req, _ := http.NewRequest("GET", host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		resp, err := hc.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Since(start) > 3*time.Minute {
			t.Fatalf("kube-apiserver not ready: %v", err)
		}
	}
	cs, err := kubernetes.NewForConfig(restConfig(host, adminToken))
	if err != nil {
		t.Fatal(err)
	}
	return cs, host
}

func restConfig(host, token string) *rest.Config {
	return &rest.Config{Host: host, BearerToken: token, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
}

// grantRouter gives user kvroute what docs/deploy.md says the router
// needs, and no more, and waits until the authorizer says it may watch.
func grantRouter(t *testing.T, admin *kubernetes.Clientset, host string) {
	t.Helper()
	ctx := context.Background()
	read := []string{"get", "list", "watch"}
	role := &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "kvroute-discovery", Namespace: e2eNS}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: read},
		{APIGroups: []string{"discovery.k8s.io"}, Resources: []string{"endpointslices"}, Verbs: read},
	}}
	if _, err := admin.RbacV1().Roles(e2eNS).Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "kvroute-discovery", Namespace: e2eNS},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: "kvroute"}},
		RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "kvroute-discovery"}}
	if _, err := admin.RbacV1().RoleBindings(e2eNS).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	router, err := kubernetes.NewForConfig(restConfig(host, routerToken))
	if err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		r, err := router.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authzv1.ResourceAttributes{Namespace: e2eNS, Verb: "watch", Group: "discovery.k8s.io", Resource: "endpointslices"}}}, metav1.CreateOptions{})
		if err == nil && r.Status.Allowed {
			break
		}
		if time.Since(start) > time.Minute {
			t.Fatalf("the router's Role never took effect: %v", err)
		}
	}
	// And nothing beyond it: the router may not write, nor read secrets.
	for _, ra := range []authzv1.ResourceAttributes{{Namespace: e2eNS, Verb: "update", Group: "discovery.k8s.io", Resource: "endpointslices"},
		{Namespace: e2eNS, Verb: "list", Resource: "secrets"}, {Namespace: "default", Verb: "list", Resource: "pods"}} {
		r, err := router.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authzv1.SelfSubjectAccessReview{Spec: authzv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &ra}}, metav1.CreateOptions{})
		if err != nil || r.Status.Allowed {
			t.Fatalf("router may %s %s in %q (err %v): more than least privilege", ra.Verb, ra.Resource, ra.Namespace, err)
		}
	}
}

func writeKubeconfig(t *testing.T, host string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: e2e, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: kvroute, user: {token: %q}}]
contexts: [{name: e2e, context: {cluster: e2e, user: kvroute}}]
current-context: e2e
`, host, routerToken)
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// engine is an emulated vLLM engine on loopback, published as the pod
// name in an EndpointSlice of its own (its port differs from the others').
type e2eEngine struct {
	pod  string
	srv  *httptest.Server
	port int32
}

func newEngine(t *testing.T, pod string) *e2eEngine {
	t.Helper()
	p, err := engine.LookupPreset("a100-llama3-8b")
	if err != nil {
		t.Fatal(err)
	}
	em, err := emulator.New(emulator.Config{Preset: p, TimeScale: 1, Model: "shared"})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(em.Handler())
	t.Cleanup(func() { srv.Close(); _ = em.Close() })
	return &e2eEngine{pod: pod, srv: srv, port: int32(srv.Listener.Addr().(*net.TCPAddr).Port)}
}

// slice is e's EndpointSlice of Service vllm: ready, or terminating (still
// serving).
func (e *e2eEngine) slice(ready bool) *discoveryv1.EndpointSlice {
	term := !ready
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: "vllm-" + e.pod, Namespace: e2eNS, Labels: map[string]string{discoveryv1.LabelServiceName: "vllm", discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       []discoveryv1.EndpointPort{{Name: new("http"), Port: new(e.port), Protocol: new(corev1.ProtocolTCP)}},
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Serving: new(true), Terminating: &term},
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: e2eNS, Name: e.pod}}},
	}
}

// source publishes engines as the router's entry watches them.
type source interface {
	add(ctx context.Context, e *e2eEngine) error
	terminate(ctx context.Context, e *e2eEngine) error
}

// sliceSource publishes each engine in an EndpointSlice of its own.
type sliceSource struct{ cs kubernetes.Interface }

func (s sliceSource) add(ctx context.Context, e *e2eEngine) error {
	_, err := s.cs.DiscoveryV1().EndpointSlices(e2eNS).Create(ctx, e.slice(true), metav1.CreateOptions{})
	return err
}

func (s sliceSource) terminate(ctx context.Context, e *e2eEngine) error {
	_, err := s.cs.DiscoveryV1().EndpointSlices(e2eNS).Update(ctx, e.slice(false), metav1.UpdateOptions{})
	return err
}

// podSource publishes each engine as a pod bound to a node that has no
// kubelet, its status written ready at the engine's address.
type podSource struct{ cs kubernetes.Interface }

func (s podSource) add(ctx context.Context, e *e2eEngine) error {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: e.pod, Namespace: e2eNS, Labels: map[string]string{"app": "vllm"}},
		Spec: corev1.PodSpec{NodeName: "node-without-kubelet", Containers: []corev1.Container{{Name: "engine", Image: "vllm",
			Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: e.port}}}}}}
	p, err := s.cs.CoreV1().Pods(e2eNS).Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		return err
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.0.0.1", PodIPs: []corev1.PodIP{{IP: "127.0.0.1"}},
		Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
	_, err = s.cs.CoreV1().Pods(e2eNS).UpdateStatus(ctx, p, metav1.UpdateOptions{})
	return err
}

func (s podSource) terminate(ctx context.Context, e *e2eEngine) error {
	return s.cs.CoreV1().Pods(e2eNS).Delete(ctx, e.pod, metav1.DeleteOptions{GracePeriodSeconds: new(int64(60))})
}

// chat sends one chat request through the router and returns the backend
// that served it; a stream is read to its end and must finish with
// [DONE].
func chat(router string, stream bool, maxTokens int, started func(backend string)) (string, error) {
	body := fmt.Sprintf(`{"model":"shared","stream":%v,"max_tokens":%d,"messages":[{"role":"user","content":"request %d"}]}`, stream, maxTokens, time.Now().UnixNano())
	resp, err := http.Post(router+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b := resp.Header.Get("X-Kvroute-Backend")
	if resp.StatusCode != 200 {
		msg, _ := io.ReadAll(resp.Body)
		return b, fmt.Errorf("status %d: %s", resp.StatusCode, msg)
	}
	if started != nil {
		started(b)
	}
	if !stream {
		_, err = io.Copy(io.Discard, resp.Body)
		return b, err
	}
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		if sc.Text() == "data: [DONE]" {
			done = true
		}
	}
	if err := sc.Err(); err != nil || !done {
		return b, fmt.Errorf("stream from %s cut (done %v): %v", b, done, err)
	}
	return b, nil
}

// TestKubeAPIServerE2E: a router watching a real API server sends traffic
// to an endpoint soon after its EndpointSlice says it is ready, and, once
// a slice says an endpoint is terminating, sends it no new request while
// its streams in flight finish. The figures are logged for
// docs/benchmarks.md; the targets (1 s to first traffic, no new request
// after the update's watch event, no stream lost) are checked.
func TestKubeAPIServerE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and kube-apiserver")
	}
	admin, host := controlPlane(t)
	if _, err := admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e2eNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	grantRouter(t, admin, host)
	// The API server refuses loopback addresses in EndpointSlices (and
	// the engines may only listen on loopback), so against it the router
	// watches pods by label, whose status the test writes as a kubelet
	// would: terminating is a graceful delete (deletionTimestamp set).
	joinAndDrain(t, admin, podSource{admin}, config.Kubernetes{Selector: map[string]string{"app": "vllm"}, Port: "http", Kubeconfig: writeKubeconfig(t, host)})
}

// TestKubeFakeE2E is TestKubeAPIServerE2E's router, engines and
// measurements with client-go's fake clientset in place of the API server
// (its watch events are delivered in process), so that the path from a
// watch event to a routed request is measured on every machine.
func TestKubeFakeE2E(t *testing.T) {
	cs := fake.NewClientset()
	old := members.KubeClients
	members.KubeClients = func(string) (kubernetes.Interface, dynamic.Interface, error) {
		return cs, dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), nil
	}
	t.Cleanup(func() { members.KubeClients = old })
	joinAndDrain(t, cs, sliceSource{cs}, config.Kubernetes{Service: "vllm", Port: "http"})
}

// joinAndDrain runs a router (round-robin, no warm-up) whose one entry
// watches Service vllm's EndpointSlices through admin's API server, with
// kubeconfig, and measures how fast an endpoint joins and drains.
func joinAndDrain(t *testing.T, admin kubernetes.Interface, src source, kc config.Kubernetes) {
	meter := clocktest.Start(t)
	ctx := context.Background()
	a, b := newEngine(t, "vllm-a"), newEngine(t, "vllm-b")
	if err := src.add(ctx, a); err != nil {
		t.Fatal(err)
	}

	cfg := config.Default()
	cfg.Listen = "127.0.0.1:0"
	cfg.Policy = "round-robin" // what is measured is discovery, not a policy's taste
	cfg.Fleet.Warmup = 0
	kc.Namespace = e2eNS
	cfg.Backends = []config.Backend{{Name: "vllm", Models: []string{"shared"}, Kubernetes: &kc}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	router := "http://" + srv.Addr()
	if got, err := chat(router, false, 4, nil); err != nil || got != e2eNS+"/vllm-a" {
		t.Fatalf("first request: backend %q, %v; want llm/vllm-a, listed at startup", got, err)
	}

	// Join: B's slice is created; requests go on one after another until
	// one lands on B.
	t0 := time.Now()
	if err := src.add(ctx, b); err != nil {
		t.Fatal(err)
	}
	created := time.Now()
	var join time.Duration
	for i := 0; ; i++ {
		got, err := chat(router, false, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got == e2eNS+"/vllm-b" {
			join = time.Since(t0)
			break
		}
		if i > 2000 || time.Since(t0) > time.Minute {
			t.Fatalf("llm/vllm-b got no request in %d requests, %v", i, time.Since(t0))
		}
	}
	t.Logf("join: first request on the new endpoint %v after its create (EndpointSlice or pod) was sent (the call took %v)", join, created.Sub(t0))

	// Drain: streams run on A; A's slice turns terminating; every request
	// sent after the router saw it goes to B, and every stream finishes.
	const streams = 4
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	streamOnA := make(chan struct{}, streams)
	for range streams {
		wg.Go(func() {
			got, err := chat(router, true, 200, func(be string) {
				if be == e2eNS+"/vllm-a" {
					streamOnA <- struct{}{}
				}
			})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			_ = got
		})
	}
	// Wait for a stream on A (round-robin puts half of them there).
	select {
	case <-streamOnA:
	case <-time.After(time.Minute):
		t.Fatal("no stream started on llm/vllm-a")
	}
	t1 := time.Now()
	if err := src.terminate(ctx, a); err != nil {
		t.Fatal(err)
	}
	updated := time.Now()
	// Requests one after another; the router's own fleet says from which
	// one on A was draining: none of those may go to A.
	var bA *fleet.Backend
	for _, be := range srv.Fleet().Snapshot().All {
		if be.Name == e2eNS+"/vllm-a" && !be.Retired() {
			bA = be
		}
	}
	if bA == nil {
		t.Fatal("llm/vllm-a is not in the fleet")
	}
	drainedAt, drained := -1, time.Duration(0)
	onA, onAAfterDrain := 0, 0
	const sent = 40
	for i := range sent {
		if drainedAt < 0 && bA.Draining() {
			drainedAt, drained = i, time.Since(t1)
		}
		got, err := chat(router, false, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got == e2eNS+"/vllm-a" {
			onA++
			if drainedAt >= 0 {
				onAAfterDrain++
			}
		}
	}
	inFlight := bA.Load().InFlight
	wg.Wait()
	if len(errs) > 0 {
		t.Errorf("streams lost while their endpoint terminated: %v", errs)
	}
	t.Logf("drain: the update call took %v; the router drained the endpoint by request %d (%v after the update was sent); of %d requests sent one after another from the update's return, %d went to the terminating endpoint, %d of them after the drain; %d streams started, %d lost; streams still on it when the requests ended: %d; retired then: %v",
		updated.Sub(t1), drainedAt, drained, sent, onA, onAAfterDrain, streams, len(errs), inFlight, bA.Retired())
	if drainedAt < 0 {
		t.Error("the terminating endpoint was never drained")
	}
	if onAAfterDrain > 0 {
		t.Errorf("%d new requests went to the terminating endpoint after it was drained", onAAfterDrain)
	}
	// The router settles a stream just after the client reads its end.
	for start := time.Now(); !bA.Retired(); time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatal("the terminating endpoint was not retired once its streams ended")
		}
	}
	if join > time.Second {
		meter.SkipIfBehind(t, time.Second, "the new endpoint's first request came %v after its slice was created", join)
		t.Errorf("target missed: the new endpoint's first request came %v after its slice was created (target 1s)", join)
	}
}
