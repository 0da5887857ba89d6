package kube

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/initd/firstboot/facts"
	"github.com/kilnproject/kiln/initd/firstboot/render"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

func TestObjectPath(t *testing.T) {
	for _, tc := range []struct {
		doc, want, err string
	}{
		{doc: "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {name: kube-proxy, namespace: kube-system}", want: "/apis/apps/v1/namespaces/kube-system/daemonsets/kube-proxy"},
		{doc: "apiVersion: v1\nkind: Service\nmetadata: {name: kube-dns, namespace: kube-system}", want: "/api/v1/namespaces/kube-system/services/kube-dns"},
		{doc: "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: 'kubeadm:get-nodes'}", want: "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/kubeadm:get-nodes"},
		{doc: "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}", err: "no metadata.namespace"},
		{doc: "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: x}", err: `kind "Widget" is not one kiln-init can apply`},
		{doc: "kind: ConfigMap\nmetadata: {name: x, namespace: y}", err: "no apiVersion"},
		{doc: "apiVersion: v1\nkind: ConfigMap\nmetadata: {namespace: y}", err: "no metadata.name"},
	} {
		objs, err := parseManifests([]byte("# a namespace first\napiVersion: v1\nkind: Namespace\nmetadata: {name: ok}\n---\n"+tc.doc), "addons/x.yaml")
		switch {
		case tc.err != "":
			if err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), "addons/x.yaml: document 2") {
				t.Errorf("%q: err = %v, want one naming the file, document and %q", tc.doc, err, tc.err)
			}
		case err != nil || len(objs) != 2:
			t.Errorf("%q: %v, %v", tc.doc, objs, err)
		default:
			if p, _ := objs[1].path(); p != tc.want {
				t.Errorf("%q: path %s, want %s", tc.doc, p, tc.want)
			}
		}
	}
}

func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&apiError{code: 503}, true},
		{&apiError{code: 429}, true},
		{&apiError{code: 409}, true},
		{fmt.Errorf("apply x: %w", &apiError{code: 500}), true},
		{&url.Error{Op: "Get", URL: "https://x", Err: errors.New("connection refused")}, true},
		{&apiError{code: 403}, false},
		{&apiError{code: 422}, false},
		{errors.New(`kind "Widget" is not one kiln-init can apply`), false},
	} {
		if got := transient(tc.err); got != tc.want {
			t.Errorf("transient(%v) = %t, want %t", tc.err, got, tc.want)
		}
	}
}

// The rendered addons (profiles/templates/control-plane) are objects kiln-init can apply,
// with the images and addresses a user expects.
func TestAddonManifests(t *testing.T) {
	root := t.TempDir()
	d := render.Data{Role: "control-plane", Facts: facts.Facts{Hostname: "cp-1", IPv4: "10.0.0.11"}}
	if _, err := render.Render("../../profiles/templates/control-plane", root, d); err != nil {
		t.Fatal(err)
	}
	files, err := addonFiles(filepath.Join(root, nodeimage.AddonsDir))
	if err != nil || len(files) != 2 {
		t.Fatalf("addon files %v, %v", files, err)
	}
	kinds := map[string]object{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := parseManifests(data, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range objs {
			kinds[o.String()] = o
		}
	}
	for name, want := range map[string]string{
		"daemonset kube-system/kube-proxy": "registry.k8s.io/kube-proxy:v1.37.2",
		"deployment kube-system/coredns":   "registry.k8s.io/coredns/coredns:v1.15.0",
	} {
		o, ok := kinds[name]
		if !ok {
			t.Errorf("no %s among %d objects", name, len(kinds))
			continue
		}
		c := o["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
		if c["image"] != want {
			t.Errorf("%s image %v, want %s", name, c["image"], want)
		}
	}
	svc := kinds["service kube-system/kube-dns"]
	if svc == nil || svc["spec"].(map[string]any)["clusterIP"] != "10.96.0.10" {
		t.Errorf("kube-dns service = %v", svc)
	}
	cm := kinds["configmap kube-system/kube-proxy"]
	if cm == nil || !strings.Contains(cm["data"].(map[string]any)["kubeconfig.conf"].(string), "server: https://10.0.0.11:6443") ||
		!strings.Contains(cm["data"].(map[string]any)["config.conf"].(string), `clusterCIDR: "10.244.0.0/16"`) {
		t.Errorf("kube-proxy configmap = %v", cm)
	}
}
