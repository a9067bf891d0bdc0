// deploy/deployment.yaml against deploy/rbac.yaml, and the example run
// with the Deployment's arguments as the ServiceAccount it names.

package kube

import (
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/bgctl/controller/ha/kube/internal/kubetest"
)

const deployment = "deploy/deployment.yaml"

// The Deployment runs its pods as the manifest's ServiceAccount, in its
// namespace, and the example accepts the arguments it passes: run with
// them, the pod's name and namespace put in as the kubelet would and the
// cluster given as a kubeconfig for the ServiceAccount's token, it joins,
// its readiness probe answers 200 and its placement page shows it, and
// on SIGTERM it leaves and exits with status 0.
func TestDeploymentRunsTheExampleAsTheManifestsServiceAccount(t *testing.T) {
	c := needCluster(t)
	var sa *corev1.ServiceAccount
	for _, obj := range readManifest(t) {
		if o, ok := obj.(*corev1.ServiceAccount); ok {
			sa = o
		}
	}
	if sa == nil {
		t.Fatalf("%s has no ServiceAccount", manifest)
	}
	d := readDeployment(t)
	pod := d.Spec.Template.Spec
	if d.Namespace != sa.Namespace || pod.ServiceAccountName != sa.Name {
		t.Fatalf("%s runs as ServiceAccount %q in %q; %s makes %q in %q", deployment, pod.ServiceAccountName, d.Namespace, manifest, sa.Name, sa.Namespace)
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%s: %d containers, want the example's alone", deployment, len(pod.Containers))
	}
	ctr := pod.Containers[0]
	probe := ctr.ReadinessProbe
	if probe == nil || probe.HTTPGet == nil {
		t.Fatalf("%s: no HTTP readiness probe", deployment)
	}
	port := containerPort(t, ctr, probe.HTTPGet.Port)

	podName := "replicas-" + strings.ToLower(rand.Text()[:10])
	args := expandArgs(t, ctr, podName, d.Namespace)
	listen := fmt.Sprintf(":%d", port)
	if !slices.Contains(args, "-listen="+listen) {
		t.Fatalf("%s: the probe asks port %d, the example listens as %q says", deployment, port, args)
	}
	free, err := kubetest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", free)
	for i, a := range args {
		if a == "-listen="+listen {
			args[i] = "-listen=" + addr // the test's own port, where the pod has its own network
		}
	}
	args = append(args, "-kubeconfig="+writeKubeconfig(t, c))
	applyManifest(t, c)

	bin := buildExample(t)
	cmd := exec.Command(bin, args...)
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // joined below, or by the cleanup
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	output := func() string { b, _ := os.ReadFile(out.Name()); return string(b) }

	url := "http://" + addr
	deadline := time.Now().Add(60 * time.Second)
	for {
		status, _ := get(url + probe.HTTPGet.Path)
		if status == http.StatusOK {
			break
		}
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the example exited (%v) before its readiness probe answered 200:\n%s", err, output())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s%s: status %d after 60 s:\n%s", url, probe.HTTPGet.Path, status, output())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if status, page := get(url + "/placement"); status != http.StatusOK || !strings.Contains(page, podName) {
		t.Errorf("/placement: status %d, want 200 and the member %s:\n%s", status, podName, page)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("after SIGTERM the example exited with %v:\n%s", err, output())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the example did not exit within 30 s of SIGTERM:\n%s", output())
	}
}

// readDeployment decodes deploy/deployment.yaml, a Deployment alone.
func readDeployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	b, err := os.ReadFile(deployment)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.Decode(b)
	if err != nil {
		t.Fatalf("%s: %v", deployment, err)
	}
	if len(objs) != 1 {
		t.Fatalf("%s: %d objects, want a Deployment alone", deployment, len(objs))
	}
	d, ok := objs[0].(*appsv1.Deployment)
	if !ok {
		t.Fatalf("%s holds a %T, want a Deployment", deployment, objs[0])
	}
	return d
}

// containerPort returns the number port names in ctr: a number, or the
// name of one of its ports.
func containerPort(t *testing.T, ctr corev1.Container, port intstr.IntOrString) int {
	t.Helper()
	if port.Type == intstr.Int {
		return port.IntValue()
	}
	for _, p := range ctr.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort)
		}
	}
	t.Fatalf("%s: the probe's port %q is none of the container's", deployment, port.StrVal)
	return 0
}

// expandArgs returns ctr's arguments with $(VAR) put in as the kubelet
// does, for the variables of its env, which must come from the pod's
// name and namespace (the downward API) alone.
func expandArgs(t *testing.T, ctr corev1.Container, podName, namespace string) []string {
	t.Helper()
	vals := map[string]string{}
	for _, e := range ctr.Env {
		if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil {
			t.Fatalf("%s: env %s does not come from the pod", deployment, e.Name)
		}
		switch e.ValueFrom.FieldRef.FieldPath {
		case "metadata.name":
			vals[e.Name] = podName
		case "metadata.namespace":
			vals[e.Name] = namespace
		default:
			t.Fatalf("%s: env %s comes from %s", deployment, e.Name, e.ValueFrom.FieldRef.FieldPath)
		}
	}
	args := append(append([]string(nil), ctr.Command...), ctr.Args...)
	for i, a := range args {
		for name, v := range vals {
			a = strings.ReplaceAll(a, "$("+name+")", v)
		}
		if strings.Contains(a, "$(") {
			t.Fatalf("%s: argument %q names a variable the container does not set", deployment, ctr.Args[i])
		}
		args[i] = a
	}
	if !slices.Contains(args, "-id="+podName) {
		t.Fatalf("%s: the arguments %q do not make the pod's name the replica's ID", deployment, args)
	}
	return args
}

// writeKubeconfig writes a kubeconfig for the cluster with the replicas'
// token, the ServiceAccount's stand-in, and returns its path.
func writeKubeconfig(t *testing.T, c *cluster) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority: %q}
users:
- name: replica
  user: {token: %q}
contexts:
- name: test
  context: {cluster: test, user: replica}
current-context: test
`, c.api.url, c.api.caFile, c.api.replicaToken)
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// buildExample builds examples/replicas and returns the binary's path.
func buildExample(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "replicas")
	cmd := exec.Command("go", "build", "-o", bin, "./examples/replicas")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/replicas: %v\n%s", err, out)
	}
	return bin
}

// get returns the status and body of a GET of url; status 0 when it
// failed. It keeps no connection open.
func get(url string) (int, string) {
	hc := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
