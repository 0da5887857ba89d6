package kube

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/kilnproject/kiln/initd/firstboot/facts"
	"github.com/kilnproject/kiln/initd/firstboot/render"
	"github.com/kilnproject/kiln/initd/pki"
	"github.com/kilnproject/kiln/initd/task"
	"github.com/kilnproject/kiln/internal/kubeconfig"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/poll"
	"github.com/kilnproject/kiln/internal/testkit"
)

const (
	testNode     = "cp-1"
	testNodeIP   = "127.0.0.2" // on lo; etcd also listens on 127.0.0.1, as the manifest says
	testToken    = "abcdef.0123456789abcdef"
	testEndpoint = "api.internal.demo.example.com:6443"
)

// manifestCommand reads the command of a rendered static pod below root.
func manifestCommand(t *testing.T, root, rel string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	var pod struct {
		Spec struct {
			Containers []struct{ Command []string } `yaml:"containers"`
		} `yaml:"spec"`
	}
	if err := yaml.Unmarshal(data, &pod); err != nil {
		t.Fatalf("%s: %v", rel, err)
	}
	return pod.Spec.Containers[0].Command
}

// startComponent runs a static pod's command on the host, its paths moved below root
// and its ports replaced, and stops it when the test ends.
func startComponent(t *testing.T, died context.CancelCauseFunc, root string, cmd []string, ports map[string]string, extra ...string) {
	t.Helper()
	bin := componentBin(cmd[0])
	args := make([]string, 0, len(cmd)-1)
	for _, a := range cmd[1:] {
		a = strings.ReplaceAll(a, "/etc/kubernetes/", root+"/etc/kubernetes/")
		a = strings.ReplaceAll(a, "/var/lib/etcd", root+"/var/lib/etcd")
		for from, to := range ports {
			a = strings.ReplaceAll(a, from, to)
		}
		args = append(args, a)
	}
	args = append(args, extra...)
	var log bytes.Buffer
	c := exec.Command(bin, args...)
	c.Stdout, c.Stderr = &log, &log
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	stopping := make(chan struct{})
	go func() {
		err := c.Wait()
		close(exited)
		select {
		case <-stopping:
		default:
			died(fmt.Errorf("%s exited: %v", cmd[0], err))
		}
	}()
	t.Cleanup(func() {
		close(stopping)
		c.Process.Kill()
		<-exited
		if t.Failed() {
			lines := strings.Split(strings.TrimSpace(log.String()), "\n")
			t.Logf("%s log (end):\n%s", cmd[0], strings.Join(lines[max(0, len(lines)-15):], "\n"))
		}
	})
}

// controlPlane renders the control-plane templates for a node at testNodeIP, makes its
// PKI with initd/pki (the CAs as kiln cluster init makes them, the leaves and kubeconfigs
// as first boot does) and runs etcd, kube-apiserver and kube-controller-manager from the
// rendered manifests (no kubelet, no scheduler). It returns the node root and the API
// server's URL, and a context that ends when a component exits.
func controlPlane(t *testing.T) (ctx context.Context, root, server string) {
	t.Helper()
	return controlPlaneWith(t, true)
}

// controlPlaneWith is controlPlane, with kube-controller-manager only when controllerManager.
func controlPlaneWith(t *testing.T, controllerManager bool) (ctx context.Context, root, server string) {
	t.Helper()
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		if componentBin(b) == "" {
			t.Skipf("%s not found (built by qemu-tests/e2e/build-components.sh into $KILN_E2E_CACHE/bin); CI must provide etcd, kube-apiserver and kube-controller-manager", b)
		}
	}
	root = t.TempDir()
	now := time.Now()
	pkiDir := filepath.Join(root, "etc/kubernetes/pki")
	for name, cn := range map[string]string{pki.CAName: pki.CACommonName, pki.FrontProxyCAName: pki.FrontProxyCACommonName, pki.EtcdCAName: pki.EtcdCACommonName} {
		kp, err := pki.NewCA(cn, now)
		if err != nil {
			t.Fatal(err)
		}
		if err := pki.WriteKeyPair(pkiDir, name, kp); err != nil {
			t.Fatal(err)
		}
	}
	sa, err := pki.NewServiceAccountKey()
	if err != nil {
		t.Fatal(err)
	}
	if err := pki.WriteKeyPair(pkiDir, pki.ServiceAccount, sa); err != nil {
		t.Fatal(err)
	}
	node := pki.Node{Hostname: testNode, IPs: []net.IP{net.ParseIP(testNodeIP)}, APIServerSANs: []string{"api.internal.demo.example.com"}}
	if _, err := pki.ControlPlaneCerts(pkiDir, node, now); err != nil {
		t.Fatal(err)
	}

	d := render.Data{Role: "control-plane", Facts: facts.Facts{Hostname: testNode, IPv4: testNodeIP}}
	d.Node.ClusterName = "demo"
	d.Node.Kubernetes.APIServer = "https://" + testEndpoint
	if _, err := render.Render("../../profiles/templates/control-plane", root, d); err != nil {
		t.Fatal(err)
	}

	ctx, died := context.WithCancelCause(context.Background())
	t.Cleanup(func() { died(nil) })
	ports := map[string]string{":2379": ":" + strconv.Itoa(testkit.FreePort(t)), ":2380": ":" + strconv.Itoa(testkit.FreePort(t)), ":2381": ":" + strconv.Itoa(testkit.FreePort(t))}
	apiPort := strconv.Itoa(testkit.FreePort(t))
	startComponent(t, died, root, manifestCommand(t, root, "etc/kubernetes/etcd/etcd.manifest"), ports)
	ports["--secure-port=6443"] = "--secure-port=" + apiPort
	// The kubernetes Service's endpoint may not be a loopback address: no reconciler here.
	startComponent(t, died, root, manifestCommand(t, root, "etc/kubernetes/manifests/kube-apiserver.yaml"), ports,
		"--endpoint-reconciler-type=none")

	server = "https://" + net.JoinHostPort(testNodeIP, apiPort)
	if _, err := pki.ControlPlaneKubeconfigs(filepath.Join(root, "etc/kubernetes"), pkiDir, node, server, now); err != nil {
		t.Fatal(err)
	}
	if controllerManager {
		startComponent(t, died, root, manifestCommand(t, root, "etc/kubernetes/manifests/kube-controller-manager.yaml"), ports,
			"--secure-port="+strconv.Itoa(testkit.FreePort(t)))
	}
	mustWrite(t, filepath.Join(root, nodeimage.BootstrapTokenPath), []byte(testToken+"\n"), 0o600)
	// kubelet copies kubelet.conf's embedded certificate to its rotation store when it starts.
	kc, err := os.ReadFile(filepath.Join(root, nodeimage.KubeletConfPath))
	if err != nil {
		t.Fatal(err)
	}
	k, err := kubeconfig.Parse(kc)
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(root, nodeimage.KubeletClientCertPath), append(k.CertPEM, k.KeyPEM...), 0o600)
	return ctx, root, server
}

// runBootstrap runs the control-plane bootstrap as kiln-control-plane.service does.
func runBootstrap(t *testing.T, ctx context.Context, root string, podCIDRs ...string) *Stage {
	t.Helper()
	tasks, err := BootstrapTasks(BootstrapOptions{Root: root, NodeName: testNode, APIEndpoint: testEndpoint,
		APIWait: 3 * time.Minute, NodeWait: time.Minute, interval: 500 * time.Millisecond, PodCIDRs: podCIDRs,
		Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err != nil {
		t.Fatal(err)
	}
	st, err := RunStage(ctx, StageControlPlane, tasks, RunOptions{Root: root}, nil)
	if err != nil {
		t.Fatalf("bootstrap: %s (%v)", st.Summary(), context.Cause(ctx))
	}
	return st
}

// csr is a kubelet's client certificate request, as its TLS bootstrap sends it.
func csr(t *testing.T, node string) object {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + node, Organization: []string{"system:nodes"}}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return object{
		"apiVersion": "certificates.k8s.io/v1",
		"kind":       "CertificateSigningRequest",
		"metadata":   map[string]any{"generateName": "node-csr-"},
		"spec": map[string]any{
			"request":    base64.StdEncoding.EncodeToString(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})),
			"signerName": "kubernetes.io/kube-apiserver-client-kubelet",
			"usages":     []string{"digital signature", "client auth"},
		},
	}
}

func TestBootstrapControlPlane(t *testing.T) {
	cpCtx, root, server := controlPlane(t)
	ctx, cancel := context.WithTimeout(cpCtx, 5*time.Minute)
	defer cancel()
	ca, err := os.ReadFile(filepath.Join(root, nodeimage.KubeCACertPath))
	if err != nil {
		t.Fatal(err)
	}

	go registerNode(ctx, root)

	start := time.Now()
	first := runBootstrap(t, ctx, root)
	t.Logf("first bootstrap: %s (API up after %s)", first.Summary(), time.Since(start).Round(time.Second))
	for _, ts := range first.Tasks {
		if ts.State != task.StateApplied && ts.Name != "api-ready" {
			t.Errorf("first run: task %s %s, want applied", ts.Name, ts.State)
		}
	}
	if st, err := ReadStage(root, StageControlPlane); err != nil || st.State != StateOK || len(st.Tasks) != len(first.Tasks) {
		t.Errorf("stored stage = %+v, %v", st, err)
	}

	admin, err := LoadKubeconfig(root, nodeimage.AdminConfPath)
	if err != nil {
		t.Fatal(err)
	}
	b := bootstrapped{ctx: ctx, root: root, server: server, ca: ca, admin: admin}
	t.Run("the bootstrap token creates a CSR", b.checkTokenCSR)
	t.Run("a wrong token is refused", b.checkWrongToken)
	t.Run("cluster-info is readable anonymously", b.checkClusterInfo)
	t.Run("the node is marked control plane", b.checkMarked)
	t.Run("the addons are in the cluster", b.checkAddons)
	t.Run("kubelet.conf uses kubelet's rotated certificate", b.checkKubeletConf)
	t.Run("kiln-cni writes the node's pod CIDR", b.checkCNI)
	t.Run("a second run changes nothing", b.checkSecondRun)
}

// bootstrapped is the control plane TestBootstrapControlPlane bootstrapped, for its subtests.
type bootstrapped struct {
	ctx          context.Context
	root, server string
	ca           []byte
	admin        *Client
}

// registerNode registers the node as kubelet does (with its own taint, which must stay), a
// while after the bootstrap started waiting for it.
func registerNode(ctx context.Context, root string) {
	super, err := LoadKubeconfig(root, nodeimage.SuperAdminConfPath)
	if err != nil {
		return
	}
	n := object{"apiVersion": "v1", "kind": "Node", "metadata": map[string]any{"name": testNode},
		"spec": map[string]any{"taints": []any{map[string]any{"key": "example.com/keep", "effect": "NoExecute"}}}}
	body, _ := json.Marshal(n)
	_ = poll.Retry(ctx, poll.Options{What: "node " + testNode + " to register", Backoff: poll.Constant(time.Second)},
		func(ctx context.Context) error {
			err := super.do(ctx, http.MethodPost, "/api/v1/nodes", contentJSON, body, nil)
			if isConflict(err) {
				return nil
			}
			return err
		})
}

// checkTokenCSR checks that the bootstrap token creates a CSR.
func (b bootstrapped) checkTokenCSR(t *testing.T) {
	ctx, server, ca := b.ctx, b.server, b.ca
	c, err := newClient(server, ca, testToken)
	if err != nil {
		t.Fatal(err)
	}
	var created struct {
		Metadata struct{ Name string }
		Spec     struct {
			Username string
			Groups   []string
		}
	}
	body, _ := json.Marshal(csr(t, "worker-1"))
	if err := c.do(ctx, http.MethodPost, "/apis/certificates.k8s.io/v1/certificatesigningrequests", contentJSON, body, &created); err != nil {
		t.Fatalf("create CSR with the bootstrap token: %v", err)
	}
	if created.Spec.Username != "system:bootstrap:abcdef" || !strings.Contains(strings.Join(created.Spec.Groups, ","), nodeBootstrapGroup) {
		t.Errorf("CSR %s by %s %v, want system:bootstrap:abcdef in %s", created.Metadata.Name, created.Spec.Username, created.Spec.Groups, nodeBootstrapGroup)
	}
	// kube-controller-manager approves it (kubeadm:node-autoapprove-bootstrap) and signs it.
	var got struct{ Status struct{ Certificate string } }
	err = waitUntil(ctx, 90*time.Second, time.Second, "the CSR to be signed", func(ctx context.Context) (bool, error) {
		err := c.get(ctx, "/apis/certificates.k8s.io/v1/certificatesigningrequests/"+created.Metadata.Name, &got)
		return err == nil && got.Status.Certificate != "", err
	})
	if err != nil {
		t.Errorf("the bootstrap token's CSR was not approved and signed: %v", err)
	}
	// and may read nodes (kubeadm:get-nodes), but not secrets.
	if err := c.get(ctx, "/api/v1/nodes/"+testNode, nil); err != nil {
		t.Errorf("get node with the bootstrap token: %v", err)
	}
	if err := c.get(ctx, "/api/v1/namespaces/kube-system/secrets", nil); !statusIs(err, http.StatusForbidden) {
		t.Errorf("list secrets with the bootstrap token: %v, want 403", err)
	}
}

// checkWrongToken checks that a wrong token is refused.
func (b bootstrapped) checkWrongToken(t *testing.T) {
	ctx, server, ca := b.ctx, b.server, b.ca
	c, _ := newClient(server, ca, "abcdef.ffffffffffffffff")
	body, _ := json.Marshal(csr(t, "worker-2"))
	err := c.do(ctx, http.MethodPost, "/apis/certificates.k8s.io/v1/certificatesigningrequests", contentJSON, body, nil)
	if !statusIs(err, http.StatusUnauthorized) {
		t.Errorf("create CSR with a wrong token: %v, want 401", err)
	}
}

// checkClusterInfo checks that cluster-info is readable anonymously.
func (b bootstrapped) checkClusterInfo(t *testing.T) {
	ctx, server, ca := b.ctx, b.server, b.ca
	c, _ := newClient(server, ca, "")
	var cm struct{ Data map[string]string }
	if err := c.get(ctx, "/api/v1/namespaces/kube-public/configmaps/cluster-info", &cm); err != nil {
		t.Fatalf("anonymous get cluster-info: %v", err)
	}
	var kc struct {
		Clusters []struct {
			Cluster struct {
				Server string `yaml:"server"`
				CAData string `yaml:"certificate-authority-data"`
			} `yaml:"cluster"`
		} `yaml:"clusters"`
	}
	if err := yaml.Unmarshal([]byte(cm.Data["kubeconfig"]), &kc); err != nil || len(kc.Clusters) != 1 {
		t.Fatalf("cluster-info kubeconfig: %v\n%s", err, cm.Data["kubeconfig"])
	}
	if got := kc.Clusters[0].Cluster; got.Server != "https://"+testEndpoint || got.CAData != base64.StdEncoding.EncodeToString(ca) {
		t.Errorf("cluster-info server %q, CA matches %t", got.Server, got.CAData == base64.StdEncoding.EncodeToString(ca))
	}
	// The bootstrap signer signs it with the token (usage-bootstrap-signing).
	err := waitUntil(ctx, 90*time.Second, time.Second, "the signature", func(ctx context.Context) (bool, error) {
		err := c.get(ctx, "/api/v1/namespaces/kube-public/configmaps/cluster-info", &cm)
		return err == nil && cm.Data["jws-kubeconfig-abcdef"] != "", err
	})
	if err != nil {
		t.Errorf("cluster-info has no jws-kubeconfig-abcdef signature: %v", err)
	}
	// Anonymous users read nothing else.
	if err := c.get(ctx, "/api/v1/namespaces/kube-public/configmaps", nil); !statusIs(err, http.StatusForbidden) {
		t.Errorf("anonymous list configmaps: %v, want 403", err)
	}
}

// checkMarked checks that the node is marked control plane.
func (b bootstrapped) checkMarked(t *testing.T) {
	ctx, admin := b.ctx, b.admin
	var n struct {
		Metadata struct{ Labels map[string]string }
		Spec     struct {
			Taints []struct{ Key, Effect string }
		}
	}
	if err := admin.get(ctx, "/api/v1/nodes/"+testNode, &n); err != nil {
		t.Fatal(err)
	}
	if v, ok := n.Metadata.Labels[labelControlPlane]; !ok || v != "" {
		t.Errorf("labels = %v, want %s=\"\"", n.Metadata.Labels, labelControlPlane)
	}
	want := map[string]string{taintControlPlane: "NoSchedule", "example.com/keep": "NoExecute"}
	got := map[string]string{}
	for _, tn := range n.Spec.Taints {
		got[tn.Key] = tn.Effect
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("taints = %v, want %v", got, want)
	}
}

// checkAddons checks that the addons are in the cluster.
func (b bootstrapped) checkAddons(t *testing.T) {
	ctx, admin := b.ctx, b.admin
	for _, p := range []string{
		"/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy",
		"/api/v1/namespaces/kube-system/configmaps/kube-proxy",
		"/apis/apps/v1/namespaces/kube-system/deployments/coredns",
		"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/kubeadm:node-proxier",
	} {
		if err := admin.get(ctx, p, nil); err != nil {
			t.Errorf("GET %s: %v", p, err)
		}
	}
	var svc struct{ Spec struct{ ClusterIP string } }
	if err := admin.get(ctx, "/api/v1/namespaces/kube-system/services/kube-dns", &svc); err != nil || svc.Spec.ClusterIP != "10.96.0.10" {
		t.Errorf("service kube-dns: clusterIP %q, %v; want 10.96.0.10", svc.Spec.ClusterIP, err)
	}
	var ds struct {
		Spec struct {
			Template struct {
				Spec struct{ Containers []struct{ Image string } }
			}
		}
	}
	admin.get(ctx, "/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy", &ds)
	if c := ds.Spec.Template.Spec.Containers; len(c) != 1 || c[0].Image != "registry.k8s.io/kube-proxy:"+render.DefaultKubernetesVersion {
		t.Errorf("kube-proxy containers = %+v", c)
	}
}

// checkKubeletConf checks that kubelet.conf uses kubelet's rotated certificate.
func (b bootstrapped) checkKubeletConf(t *testing.T) {
	ctx, root := b.ctx, b.root
	data, _ := os.ReadFile(filepath.Join(root, nodeimage.KubeletConfPath))
	if !strings.Contains(string(data), "client-certificate: "+nodeimage.KubeletClientCertPath) || strings.Contains(string(data), "client-certificate-data") {
		t.Errorf("kubelet.conf:\n%s", data)
	}
	kubelet, err := LoadKubeconfig(root, nodeimage.KubeletConfPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := kubelet.get(ctx, "/api/v1/nodes/"+testNode, nil); err != nil {
		t.Errorf("kubelet reads its node with the finalized kubelet.conf: %v", err)
	}
}

// checkCNI checks that kiln-cni writes the node's pod CIDR.
func (b bootstrapped) checkCNI(t *testing.T) {
	ctx, root := b.ctx, b.root
	cidrs, changed, err := EnsureCNI(ctx, CNIOptions{Root: root, NodeName: testNode, Wait: 90 * time.Second, interval: time.Second})
	if err != nil || !changed || len(cidrs) != 1 || !strings.HasPrefix(cidrs[0], "10.244.") || !strings.HasSuffix(cidrs[0], "/24") {
		t.Fatalf("EnsureCNI = %v, %v, %v; want a /24 of 10.244.0.0/16", cidrs, changed, err)
	}
	if b, err := os.ReadFile(filepath.Join(root, nodeimage.CNIConfPath)); err != nil || !strings.Contains(string(b), cidrs[0]) {
		t.Errorf("%s: %v\n%s", nodeimage.CNIConfPath, err, b)
	}
}

// checkSecondRun checks that a second run changes nothing.
func (b bootstrapped) checkSecondRun(t *testing.T) {
	ctx, root, admin := b.ctx, b.root, b.admin
	var before struct {
		Metadata struct{ ResourceVersion string }
	}
	admin.get(ctx, "/api/v1/namespaces/kube-system/secrets/bootstrap-token-abcdef", &before)
	second := runBootstrap(t, ctx, root)
	for _, ts := range second.Tasks {
		if ts.State != task.StateUnchanged {
			t.Errorf("second run: task %s %s, want unchanged", ts.Name, ts.State)
		}
	}
	var after struct {
		Metadata struct{ ResourceVersion string }
	}
	admin.get(ctx, "/api/v1/namespaces/kube-system/secrets/bootstrap-token-abcdef", &after)
	if before.Metadata.ResourceVersion == "" || before.Metadata.ResourceVersion != after.Metadata.ResourceVersion {
		t.Errorf("token Secret resourceVersion %q → %q: a re-run must not touch it (nor extend its expiry)", before.Metadata.ResourceVersion, after.Metadata.ResourceVersion)
	}
}

func TestBootstrapFailureNamesTheStep(t *testing.T) {
	root := t.TempDir()
	// An admin.conf for an API server that is not there.
	ca := testCA(t)
	admin := issue(t, ca, pki.Cert{CommonName: "kubernetes-admin", Organization: []string{pki.GroupClusterAdmins}, Client: true})
	kc := kubeconfig.Config{Cluster: "kubernetes", Server: "https://127.0.0.1:" + strconv.Itoa(testkit.FreePort(t)), CAPEM: ca.CertPEM,
		User: "kubernetes-admin", CertPEM: admin.CertPEM, KeyPEM: admin.KeyPEM}
	data, err := kc.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, filepath.Join(root, nodeimage.AdminConfPath), data, 0o600)
	tasks, err := BootstrapTasks(BootstrapOptions{Root: root, NodeName: testNode, APIEndpoint: testEndpoint,
		APIWait: 500 * time.Millisecond, interval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	st, err := RunStage(context.Background(), StageControlPlane, tasks, RunOptions{Root: root}, nil)
	if err == nil || st.State != stateFailed || st.FailedTask() != "api-ready" {
		t.Fatalf("stage = %s, err %v; want failed at api-ready", st.Summary(), err)
	}
	if s := st.Summary(); !strings.Contains(s, "failed at step api-ready") || !strings.Contains(s, "not ready") {
		t.Errorf("Summary = %q", s)
	}
	stored, err := ReadStages(root)
	if err != nil || len(stored) != 1 || stored[0].FailedTask() != "api-ready" {
		t.Errorf("ReadStages = %v, %v", stored, err)
	}
	var b bytes.Buffer
	if err := PrintStages(&b, stored); err != nil || !strings.Contains(b.String(), "failed at step api-ready") ||
		!strings.Contains(b.String(), "blocked") {
		t.Errorf("PrintStages: %v\n%s", err, b.String())
	}
}
