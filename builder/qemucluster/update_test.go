package qemucluster

import (
	"encoding/json"
	"io"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

func TestUpdateOrder(t *testing.T) {
	o := testOptionsEtcd(1, 2, 3)
	s := &State{Name: o.Name, Zone: o.Zone, Nodes: plan(o, []int{1}, []int{2, 3, 4})}
	for _, tc := range []struct {
		names []string
		want  []string
	}{
		{nil, []string{"demo-etcd-1", "demo-etcd-2", "demo-etcd-3", "demo-cp-1", "demo-worker-1", "demo-worker-2"}},
		{[]string{"demo-worker-2", "demo-cp-1"}, []string{"demo-cp-1", "demo-worker-2"}},
		{[]string{"demo-worker-1", "demo-worker-1"}, []string{"demo-worker-1"}},
	} {
		got, err := s.UpdateOrder(tc.names)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("UpdateOrder(%q) = %q, %v; want %q", tc.names, got, err, tc.want)
		}
	}
	if _, err := s.UpdateOrder([]string{"demo-worker-9"}); err == nil || !strings.Contains(err.Error(), "demo-worker-9") {
		t.Errorf("an unknown node: %v, want an error naming it", err)
	}
}

// updateImages writes <dir>/qemu-worker.json (with pxe and verity unless bare) and its pxe
// files.
func updateImages(t *testing.T, dir string, bare bool) {
	t.Helper()
	md := nodeimage.Metadata{Name: "qemu", Role: "worker"}
	if !bare {
		md.Verity = &nodeimage.VerityInfo{RootHash: strings.Repeat("ab", 32)}
		md.PXE = &nodeimage.PXEInfo{Dir: "qemu-worker-pxe", Kernel: nodeimage.PXEFile{File: "vmlinuz"},
			Initrd: nodeimage.PXEFile{File: "initrd.img"}, RootFS: nodeimage.PXEFile{File: "rootfs.img"}}
		for _, f := range []string{"vmlinuz", "initrd.img", "rootfs.img"} {
			writeFile(t, filepath.Join(dir, "qemu-worker-pxe", f), f+" bytes")
		}
	}
	b, _ := json.Marshal(md)
	writeFile(t, filepath.Join(dir, "qemu-worker.json"), string(b))
}

func writeFile(t *testing.T, p, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// Every refusal comes before any node is touched, and names what to do.
func TestPlanUpdateRefuses(t *testing.T) {
	root := t.TempDir()
	v1, v2, bare, empty := filepath.Join(root, "out"), filepath.Join(root, "out-v2"), filepath.Join(root, "bare"), filepath.Join(root, "empty")
	updateImages(t, v2, false)
	updateImages(t, bare, true)
	os.MkdirAll(empty, 0o755)
	s := &State{Name: "demo", Dir: t.TempDir(), Nodes: []Node{{Name: "demo-worker-1", Role: RoleWorker, SSHPort: 2222}, {Name: "demo-worker-2", Role: RoleWorker}}}
	s.Images.Worker = filepath.Join(v1, "qemu-worker.qcow2")
	s.Images.ControlPlane = filepath.Join(v2, "qemu-control-plane.qcow2")
	for _, tc := range []struct {
		name  string
		nodes []string
		dir   string
		want  string
	}{
		{"no directory", []string{"demo-worker-1"}, "", "--image-dir"},
		{"the overlays' backing directory", []string{"demo-worker-1"}, v2, "overlays on"},
		{"no ssh", []string{"demo-worker-2"}, bare, "--ssh-key"},
		{"no image", []string{"demo-worker-1"}, empty, "kiln bake images/qemu.yaml --role worker"},
		{"no pxe", []string{"demo-worker-1"}, bare, "add pxe to the definition's formats"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.dir == v2 {
				s.Images.Worker = filepath.Join(v2, "qemu-worker.qcow2")
				defer func() { s.Images.Worker = filepath.Join(v1, "qemu-worker.qcow2") }()
			}
			_, err := s.planUpdate(tc.nodes, UpdateOptions{ImageDir: tc.dir, Image: "qemu"})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err %v, want %q in it", err, tc.want)
			}
		})
	}
	// With the image in place, a stopped node is the last refusal.
	s.Images.ControlPlane = ""
	if _, err := s.planUpdate([]string{"demo-worker-1"}, UpdateOptions{ImageDir: v2, Image: "qemu"}); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("a stopped node: %v", err)
	}
}

// The file server the node reaches serves the update's files and nothing else.
func TestServeFiles(t *testing.T) {
	dir := t.TempDir()
	updateImages(t, dir, false)
	writeFile(t, filepath.Join(dir, "secret.key"), "no")
	var md nodeimage.Metadata
	b, _ := os.ReadFile(filepath.Join(dir, "qemu-worker.json"))
	json.Unmarshal(b, &md)
	u := nodeUpdate{json: filepath.Join(dir, "qemu-worker.json"), md: &md}
	srv := httptest.NewServer(serveFiles(dir, u.files()))
	defer srv.Close()
	for path, want := range map[string]int{"/qemu-worker.json": 200, "/qemu-worker-pxe/rootfs.img": 200, "/qemu-worker-pxe/vmlinuz": 200,
		"/qemu-worker-pxe/initrd.img": 200, "/secret.key": 404, "/": 404, "/qemu-worker-pxe/": 404, "/qemu-worker-pxe/../secret.key": 404} {
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, want)
		}
		if want == 200 && strings.HasSuffix(path, "rootfs.img") && string(body) != "rootfs.img bytes" {
			t.Errorf("GET %s: %q", path, body)
		}
	}
}

// The ssh line kiln cluster status prints and the options kiln cluster update runs ssh with
// reach the node the same way.
func TestSSHLogin(t *testing.T) {
	n := Node{SSHPort: 2222}
	if got, want := n.sshCommand(), "ssh -p 2222 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null root@127.0.0.1"; got != want {
		t.Errorf("sshCommand() = %q, want %q", got, want)
	}
	args := strings.Join((&State{}).sshArgs(&n, UpdateOptions{Identity: "/k"}, "-R", "x"), " ")
	if !strings.HasPrefix(args, "-p 2222 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes") ||
		!strings.HasSuffix(args, "-i /k -o IdentitiesOnly=yes -R x root@127.0.0.1") {
		t.Errorf("sshArgs: %s", args)
	}
	if (Node{}).sshCommand() != "" {
		t.Error("a node without ssh has an ssh line")
	}
}
