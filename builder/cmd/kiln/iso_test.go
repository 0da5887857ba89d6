package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/diskfs/go-diskfs/backend/file"
	"github.com/diskfs/go-diskfs/filesystem/iso9660"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/testkit"
)

// kiln iso add-config puts a checked config on a copy of an iso, Butane translated to Ignition,
// and refuses a config first boot would refuse, a missing -o and an existing destination.
func TestISOAddConfig(t *testing.T) {
	testkit.Tool(t, "xorriso", "xorriso")
	dir := t.TempDir()
	tree := filepath.Join(dir, "tree")
	if err := os.MkdirAll(filepath.Join(tree, "kiln"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "kiln", "root.img"), []byte("root"), 0o644); err != nil {
		t.Fatal(err)
	}
	iso := filepath.Join(dir, "metal-worker.iso")
	testkit.Run(t, "xorriso", "-as", "mkisofs", "-quiet", "-R", "-V", nodeimage.ISOLabel, "-o", iso, tree)
	bu := filepath.Join(dir, "node.bu")
	os.WriteFile(bu, []byte("variant: fcos\nversion: 1.6.0\nstorage:\n  files:\n    - path: /etc/kiln/iso.txt\n      contents: {inline: hello}\n"), 0o644)
	bad := filepath.Join(dir, "bad.bu")
	os.WriteFile(bad, []byte("variant: fcos\nversion: 1.6.0\nstorage:\n  filez: []\n"), 0o644)

	newISO := filepath.Join(dir, "node.iso")
	out, code := runKiln(t, "iso", "add-config", iso, bu, "-o", newISO)
	if code != 0 {
		t.Fatalf("kiln iso add-config: exit %d\n%s", code, out)
	}
	f, err := os.Open(newISO)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, _ := f.Stat()
	fsys, err := iso9660.Read(file.New(f, true), fi.Size(), 0, 2048)
	if err != nil {
		t.Fatal(err)
	}
	in, err := fsys.OpenFile(nodeimage.ISOConfigPath, os.O_RDONLY)
	if err != nil {
		t.Fatalf("%s: %v", nodeimage.ISOConfigPath, err)
	}
	b, _ := io.ReadAll(in)
	var ign struct {
		Ignition struct{ Version string }
		Storage  struct{ Files []struct{ Path string } }
	}
	if err := json.Unmarshal(b, &ign); err != nil || !strings.HasPrefix(ign.Ignition.Version, "3.") || len(ign.Storage.Files) != 1 || ign.Storage.Files[0].Path != "/etc/kiln/iso.txt" {
		t.Errorf("%s on the new iso: %s (%v); want the Butane config as Ignition JSON", nodeimage.ISOConfigPath, b, err)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"iso", "add-config", iso, bad, "-o", filepath.Join(dir, "bad.iso")}, bad + ": "},
		{[]string{"iso", "add-config", iso, bu}, "-o: name the new iso"},
		{[]string{"iso", "add-config", iso, bu, "-o", newISO}, "exists already"},
	} {
		out, code := runKiln(t, tc.args...)
		if code == 0 || !strings.Contains(out, tc.want) {
			t.Errorf("kiln %s: exit %d, want an error saying %q\n%s", strings.Join(tc.args, " "), code, tc.want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "bad.iso")); err == nil {
		t.Errorf("bad.iso written for a config first boot refuses")
	}
}
