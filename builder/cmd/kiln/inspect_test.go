package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/disk"
	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
	"github.com/kilnproject/kiln/internal/verity"
)

// inspectImage bakes a small real disk whose ESP carries imageJSON, with a verity tree
// appended to its root image and the root hash on its boot entry, as a bake writes it.
func inspectImage(t *testing.T, imageJSON []byte) string {
	img, _ := verityImage(t, imageJSON)
	return img
}

// verityImage is inspectImage that also returns the tree's parameters and root-a's start.
func verityImage(t *testing.T, imageJSON []byte) (string, verityDisk) {
	t.Helper()
	testkit.Tools(t, "mksquashfs")
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(tree, "etc", "hostname"), []byte("node\n"), 0o644)
	noise := make([]byte, 1<<20) // incompressible: a tree of two levels
	rand.Read(noise)
	os.WriteFile(filepath.Join(tree, "etc", "noise"), noise, 0o644)
	root := filepath.Join(dir, "root.img")
	if err := disk.MakeRootFS(context.Background(), tree, root, disk.RootFSOptions{Type: disk.SquashFS}); err != nil {
		t.Fatal(err)
	}
	boot := func(name string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, bytes.Repeat([]byte(name), 1000), 0o644)
		return p
	}
	p, err := verity.Append(root, []byte("salt"))
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "node.raw")
	res, err := disk.Build(img, disk.Spec{Size: 1 << 30, RootFS: root, RootFSType: disk.SquashFS,
		Kernel: boot("vmlinuz"), Initrd: boot("initrd.img"), Bootloader: boot("systemd-bootx64.efi"),
		Platform: "qemu", ImageJSON: imageJSON, Title: "kiln test", Seed: "inspect",
		Cmdline: fmt.Sprintf("console=ttyS0 kiln.verity.roothash=%s kiln.verity.hashoffset=%d", p.RootHashHex(), p.HashOffset)})
	if err != nil {
		t.Fatal(err)
	}
	part, _ := res.Partition(nodeimage.RootAName)
	return img, verityDisk{params: p, rootStart: part.Start}
}

type verityDisk struct {
	params    verity.Params
	rootStart int64
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
		"registry.example/tool:1@sha256:4567, imported at first boot (layer 1 (sha256:89ab): bin/ping: the extended attribute security.capability", "cmdline: ",
		"verity:  root-a ok: every block matches root hash "} {
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

// TestInspectVerity flips one byte of a disk's root, in the filesystem and in the hash tree, and
// wants inspect to exit 1 naming the partition, the block and the root hash; a boot entry whose
// root hash is another image's fails the same way.
func TestInspectVerity(t *testing.T) {
	cases := []struct {
		name  string
		at    func(v verityDisk) int64
		want  string
		entry bool // change the boot entry's root hash instead
	}{
		{"a byte of the filesystem", func(v verityDisk) int64 { return v.rootStart + 5 }, "data block 0 (byte 0) does not match", false},
		{"a byte of the tree", func(v verityDisk) int64 { return v.rootStart + v.params.HashOffset + verity.BlockSize + 3 }, "hash block 0 of level 1", false}, // the top level comes first,
		{"the superblock", func(v verityDisk) int64 { return v.rootStart + v.params.HashOffset }, "no verity superblock", false},
		{"another root hash on the boot entry", nil, "does not match the verity tree", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			img, v := verityImage(t, []byte(`{"name":"qemu"}`))
			if tc.entry {
				b, _ := os.ReadFile(img)
				old := []byte(v.params.RootHashHex())
				i := bytes.Index(b, old)
				if i < 0 {
					t.Fatal("root hash not found on the ESP")
				}
				copy(b[i:], strings.Repeat("0", 64))
				os.WriteFile(img, b, 0o644)
			} else {
				f, err := os.OpenFile(img, os.O_RDWR, 0)
				if err != nil {
					t.Fatal(err)
				}
				b := make([]byte, 1)
				f.ReadAt(b, tc.at(v))
				b[0] ^= 0x01
				f.WriteAt(b, tc.at(v))
				f.Close()
			}
			out, code := runKiln(t, "inspect", img)
			if code != 1 {
				t.Fatalf("kiln inspect of a changed root: exit %d, want 1\n%s", code, out)
			}
			for _, want := range []string{"verity:  root-a MISMATCH against root hash", "root-a does not verify against the boot entry's root hash", tc.want} {
				if !strings.Contains(out, want) {
					t.Errorf("output lacks %q:\n%s", want, out)
				}
			}
		})
	}
}
