package e2e

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kfelastic/kfelastic/internal/testenv"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

func TestAdhocPod(t *testing.T) {
	c := testenv.UseCluster(t)
	ns := c.Namespace(t, "adhoc")
	kc := testenv.NewClient(t, c.Config)
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: ns}, Spec: corev1.PodSpec{
		RestartPolicy: corev1.RestartPolicyNever,
		Containers:    []corev1.Container{{Name: "c", Image: c.WorkerImage, Command: []string{"python3", "-c", "import torch, socket; print(torch.__version__, socket.gethostbyname('kubernetes.default.svc.cluster.local'))"}}}}}
	if err := kc.Create(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	time.Sleep(40 * time.Second)
	_ = kc.Get(t.Context(), client.ObjectKeyFromObject(p), p)
	t.Logf("%+v", p.Status)
	t.Log(c.PodLogs(ns, "p", ""))
}
