package proxy

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/kvroute/kvroute/internal/discovery"
	"github.com/kvroute/kvroute/internal/members"
)

// kubeCluster is a fake Kubernetes API whose Service vllm in namespace llm
// has one pod per engine, each its own EndpointSlice (the engines listen
// on different loopback ports).
type kubeCluster struct{ cs *kubefake.Clientset }

// kubeFleet makes the routers' Kubernetes entries watch a fake API in
// which Service vllm's pods are engines (pod name to engine), labelled
// with roles (pod name to kvroute.io/role).
func kubeFleet(t *testing.T, engines map[string]*pdEngine, roles map[string]string) *kubeCluster {
	t.Helper()
	var objs []runtime.Object
	for pod, e := range engines {
		ready := true
		objs = append(objs,
			&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: pod, Namespace: "llm", Labels: map[string]string{discovery.RoleLabel: roles[pod]}}},
			&discoveryv1.EndpointSlice{
				ObjectMeta:  metav1.ObjectMeta{Name: "vllm-" + pod, Namespace: "llm", Labels: map[string]string{discoveryv1.LabelServiceName: "vllm", discoveryv1.LabelManagedBy: discovery.ManagedBy}},
				AddressType: discoveryv1.AddressTypeIPv4,
				Ports:       []discoveryv1.EndpointPort{{Port: new(hostPort(t, e.srv.URL))}},
				Endpoints: []discoveryv1.Endpoint{{Addresses: []string{"127.0.0.1"}, Conditions: discoveryv1.EndpointConditions{Ready: &ready},
					TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: "llm", Name: pod}}},
			})
	}
	cs := kubefake.NewClientset(objs...)
	old := members.KubeClients
	members.KubeClients = func(string) (kubernetes.Interface, dynamic.Interface, error) {
		return cs, dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()), nil
	}
	t.Cleanup(func() { members.KubeClients = old })
	return &kubeCluster{cs: cs}
}

// remove deletes pod's EndpointSlice: the pod is gone.
func (k *kubeCluster) remove(t *testing.T, pod string) {
	t.Helper()
	if err := k.cs.DiscoveryV1().EndpointSlices("llm").Delete(context.Background(), "vllm-"+pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
