package etcdvolume

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const manifest = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\n  namespace: kube-system\n"

func TestLinkManifest(t *testing.T) {
	const vol = "/var/lib/etcd/prod"
	target := "/var/lib/etcd/prod/manifests/etcd.manifest"
	tests := []struct {
		name string
		// inWay is what /etc/kubernetes/manifests/etcd.manifest is before: "" nothing,
		// "link:<dest>" a symlink, "file:<content>" a regular file, "dir" a directory.
		inWay       string
		onVolume    bool
		wantChanged bool
		wantErr     string
	}{
		{name: "nothing there", onVolume: true, wantChanged: true},
		{name: "volume not mounted yet: the link dangles", onVolume: false, wantChanged: true},
		{name: "link already right", inWay: "link:" + target, onVolume: true},
		{name: "link elsewhere is replaced", inWay: "link:/old/etcd.manifest", onVolume: true, wantChanged: true},
		{name: "identical file is replaced by the link", inWay: "file:" + manifest, onVolume: true, wantChanged: true},
		{name: "different file is an error", inWay: "file:kind: Pod\n", onVolume: true, wantErr: "differs from the manifest on the volume; move it away"},
		{name: "file and no manifest on the volume is an error", inWay: "file:" + manifest, wantErr: "cannot be read to compare"},
		{name: "directory in the way", inWay: "dir", onVolume: true, wantErr: "is a directory in the way"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if tt.onVolume {
				if changed, err := WriteManifest(root, vol, "etcd.manifest", []byte(manifest)); err != nil || !changed {
					t.Fatalf("WriteManifest = %v, %v", changed, err)
				}
			}
			link := filepath.Join(root, "etc/kubernetes/manifests/etcd.manifest")
			if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
				t.Fatal(err)
			}
			kind, arg := putInWay(t, link, tt.inWay)
			changed, err := LinkManifest(root, vol, "etcd.manifest")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "/etc/kubernetes/manifests/etcd.manifest") {
					t.Fatalf("LinkManifest = %v; want an error naming the link and %q", err, tt.wantErr)
				}
				if kind == "file" {
					if got, _ := os.ReadFile(link); string(got) != arg {
						t.Errorf("the file in the way was changed to %q", got)
					}
				}
				return
			}
			if err != nil || changed != tt.wantChanged {
				t.Fatalf("LinkManifest = %v, %v; want changed=%v", changed, err, tt.wantChanged)
			}
			if dest, err := os.Readlink(link); err != nil || dest != target {
				t.Errorf("link -> %q, %v; want %s", dest, err, target)
			}
			if tt.onVolume {
				// The kubelet, reading through the link inside the root, sees the manifest.
				if got, err := os.ReadFile(filepath.Join(root, target)); err != nil || string(got) != manifest {
					t.Errorf("manifest on the volume = %q, %v", got, err)
				}
			}
			if changed, err := LinkManifest(root, vol, "etcd.manifest"); err != nil || changed {
				t.Errorf("second LinkManifest = %v, %v; want unchanged", changed, err)
			}
			if entries, _ := os.ReadDir(filepath.Dir(link)); len(entries) != 1 {
				t.Errorf("manifests dir holds %d entries, want only the link", len(entries))
			}
		})
	}
}

// putInWay makes what inWay describes at link ("" nothing, "link:<dest>" a symlink,
// "file:<content>" a regular file, "dir" a directory) and returns its kind and argument.
func putInWay(t *testing.T, link, inWay string) (kind, arg string) {
	t.Helper()
	kind, arg, _ = strings.Cut(inWay, ":")
	var err error
	switch kind {
	case "link":
		err = os.Symlink(arg, link)
	case "file":
		err = os.WriteFile(link, []byte(arg), 0o600)
	case "dir":
		err = os.Mkdir(link, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	return kind, arg
}

func TestWriteManifest(t *testing.T) {
	root := t.TempDir()
	if changed, err := WriteManifest(root, "/var/lib/etcd", "etcd.manifest", []byte(manifest)); err != nil || !changed {
		t.Fatalf("WriteManifest = %v, %v", changed, err)
	}
	p := filepath.Join(root, "var/lib/etcd/manifests/etcd.manifest")
	if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("manifest: %v, %v; want mode 0600", fi, err)
	}
	if changed, err := WriteManifest(root, "/var/lib/etcd", "etcd.manifest", []byte(manifest)); err != nil || changed {
		t.Errorf("rewriting the same manifest = %v, %v; want unchanged", changed, err)
	}
	if changed, err := WriteManifest(root, "/var/lib/etcd", "etcd.manifest", []byte(manifest+"# v2\n")); err != nil || !changed {
		t.Errorf("new manifest = %v, %v; want changed", changed, err)
	}
	for _, tc := range []struct{ dir, name string }{{"var/lib/etcd", "etcd.manifest"}, {"/", "x"}, {"/var/lib/../etcd", "x"}, {"/var/lib/etcd", "a/b"}, {"/var/lib/etcd", ".."}} {
		if _, err := WriteManifest(root, tc.dir, tc.name, nil); err == nil {
			t.Errorf("WriteManifest(%q, %q) accepted", tc.dir, tc.name)
		}
		if _, err := LinkManifest(root, tc.dir, tc.name); err == nil {
			t.Errorf("LinkManifest(%q, %q) accepted", tc.dir, tc.name)
		}
	}
}
