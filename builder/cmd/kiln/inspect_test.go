package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// inspectImage bakes a small real disk whose ESP carries imageJSON.
func inspectImage(t *testing.T, imageJSON []byte) string {
	t.Helper()
	testkit.Tools(t, "mksquashfs")
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(tree, "etc", "hostname"), []byte("node\n"), 0o644)
	root := filepath.Join(dir, "root.img")
	if err := disk.MakeRootFS(context.Background(), tree, root, disk.RootFSOptions{Type: disk.SquashFS}); err != nil {
		t.Fatal(err)
	}
	boot := func(name string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, bytes.Repeat([]byte(name), 1000), 0o644)
		return p
	}
	img := filepath.Join(dir, "node.raw")
	_, err := disk.Build(img, disk.Spec{Size: 1 << 30, RootFS: root, RootFSType: disk.SquashFS,
		Kernel: boot("vmlinuz"), Initrd: boot("initrd.img"), Bootloader: boot("systemd-bootx64.efi"),
		Platform: "qemu", Cmdline: "console=ttyS0", ImageJSON: imageJSON, Title: "kiln test", Seed: "inspect"})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func runKiln(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	root := newRoot()
	root.SetOut(&stdout)
	code := execute(context.Background(), root, args, &stderr)
	return stdout.String() + stderr.String(), code
}

// kiln inspect shows the partitions and the image metadata a user asks about, for people and
// as JSON, from a real disk.
func TestInspect(t *testing.T) {
	md := nodeimage.Metadata{Name: "qemu", Role: "worker", Platform: "qemu",
		Kernel: nodeimage.KernelInfo{Version: "6.1.0-test"},
		Kubernetes: &nodeimage.KubernetesInfo{Version: "v1.37.2", Runtime: "containerd", Images: []nodeimage.ImageInfo{
			{Name: "registry.k8s.io/pause:3.10.2", Digest: "sha256:0123", Unpacked: true},
			{Name: "registry.example/tool:1", Digest: "sha256:4567", ImportReason: "layer 1 (sha256:89ab): bin/ping: the extended attribute security.capability cannot be reproduced in the tree"}}}}
	data, _ := json.Marshal(md)
	img := inspectImage(t, data)

	out, code := runKiln(t, "inspect", img)
	if code != 0 {
		t.Fatalf("kiln inspect: exit %d\n%s", code, out)
	}
	for _, want := range []string{nodeimage.RootAName, nodeimage.RootBName, "role worker", "kernel:  6.1.0-test",
		"kubernetes: v1.37.2, runtime containerd, 2 pre-pulled images", "registry.k8s.io/pause:3.10.2@sha256:0123, ready in containerd's store",
		"registry.example/tool:1@sha256:4567, imported at first boot (layer 1 (sha256:89ab): bin/ping: the extended attribute security.capability", "cmdline: "} {
		if !strings.Contains(out, want) {
			t.Errorf("kiln inspect output lacks %q:\n%s", want, out)
		}
	}

	for _, args := range [][]string{{"inspect", img, "-o", "json"}, {"inspect", img, "--json"}} {
		out, code := runKiln(t, args...)
		var doc struct {
			Metadata nodeimage.Metadata `json:"metadata"`
			Disk     struct{ Partitions []nodeimage.Partition }
		}
		if code != 0 || json.Unmarshal([]byte(out), &doc) != nil {
			t.Fatalf("kiln %s: exit %d, not JSON:\n%s", strings.Join(args, " "), code, out)
		}
		if doc.Metadata.Role != "worker" || doc.Metadata.Kubernetes == nil || len(doc.Disk.Partitions) != 3 {
			t.Errorf("kiln %s: %+v", strings.Join(args, " "), doc)
		}
	}
}
