package spec

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// overlayRepo has a worker and a control-plane profile to overlay.
func overlayRepo(t *testing.T) (root string, all []*Profile) {
	t.Helper()
	root = repo(t)
	write(t, filepath.Join(root, "profiles", "worker.yaml"), `role: worker
artifacts:
  - name: kubelet
    url: https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kubelet
    checksum: https://dl.k8s.io/release/v1.37.2/SHA256SUMS
    dest: /usr/bin/kubelet
    mode: "0755"
  - name: crictl
    url: https://example.com/crictl-v1.37.0-linux-amd64.tar.gz
    sha256: `+sum+`
    extract: {files: {crictl: /usr/bin/crictl}}
kubernetes: {version: v1.37.2}
images:
  - name: registry.k8s.io/pause:3.10.2
`)
	write(t, filepath.Join(root, "profiles", "control-plane.yaml"), `role: control-plane
kubernetes: {version: v1.37.2}
images:
  - name: registry.k8s.io/pause:3.10.2
  - name: registry.k8s.io/etcd:3.6.16-0
`)
	all, err := LoadProfiles(filepath.Join(root, "profiles"))
	if err != nil {
		t.Fatal(err)
	}
	return root, all
}

func TestProfileOverlayApply(t *testing.T) {
	root, all := overlayRepo(t)
	other := strings.Repeat("1", 64)
	file := write(t, filepath.Join(root, "e2e", "mirror.yaml"), `# the e2e mirror
artifacts:
  - name: kubelet
    url: http://127.0.0.1:8080/kubelet
    sha256: sha256:`+other+`
  - name: crictl
    path: bin/crictl.tar.gz
images:
  - name: registry.k8s.io/pause:3.10.2
    source: 127.0.0.1:5000/pause:3.10.2
    digest: `+digest+`
  - name: registry.k8s.io/etcd:3.6.16-0
    source: 127.0.0.1:5000/etcd@`+digest+`
`)
	ov, err := LoadProfileOverlay(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := ov.Check(all); err != nil {
		t.Fatalf("Check: %v", err)
	}
	worker := all[1]
	got := ov.Apply(worker)
	if worker.Artifacts[0].URL != "https://dl.k8s.io/release/v1.37.2/bin/linux/amd64/kubelet" || worker.Artifacts[0].ChecksumURL == "" || worker.Images[0].Digest != "" {
		t.Errorf("Apply changed the profile it was given: %+v", worker)
	}
	kubelet, crictl, pause := got.Artifacts[0], got.Artifacts[1], got.Images[0]
	// A replaced source drops the checksum URL, which named the replaced file's checksum.
	if kubelet.URL != "http://127.0.0.1:8080/kubelet" || kubelet.Source != kubelet.URL || kubelet.Path != "" || kubelet.ChecksumURL != "" || kubelet.SHA256 != other || kubelet.Dest != "/usr/bin/kubelet" || kubelet.Mode != 0o755 || kubelet.Pos != (Pos{file, 3}) {
		t.Errorf("kubelet = %+v", kubelet)
	}
	// A replaced source keeps the profile's sha256; the path is relative to the overlay.
	if crictl.Path != filepath.Join(root, "e2e", "bin/crictl.tar.gz") || crictl.URL != "" || crictl.Source != "bin/crictl.tar.gz" || crictl.SHA256 != sum || crictl.Extract == nil {
		t.Errorf("crictl = %+v", crictl)
	}
	want := Image{Name: "registry.k8s.io/pause:3.10.2", Source: "127.0.0.1:5000/pause:3.10.2", Digest: digest, Pos: Pos{file, 9}}
	if !reflect.DeepEqual(pause, want) {
		t.Errorf("pause = %+v, want %+v", pause, want)
	}
	cp := ov.Apply(all[0])
	if etcd := cp.Images[1]; etcd.Digest != digest || etcd.Source != "127.0.0.1:5000/etcd@"+digest {
		t.Errorf("etcd = %+v", etcd)
	}
}

func TestProfileOverlayErrors(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string // "F" is the overlay file
	}{
		{"typo in an artifact name", "artifacts:\n  - name: kubelett\n    url: http://127.0.0.1/kubelet\n", []string{
			"F:2: artifacts[0].name: \"kubelett\" is not an artifact of any profile"}},
		{"typo in an image name", "images:\n  - name: registry.k8s.io/etcd:3.6.16\n    digest: " + digest + "\n", []string{
			"F:2: images[0].name: \"registry.k8s.io/etcd:3.6.16\" is not an image of any profile"}},
		{"unknown field", "artifacts:\n  - name: kubelet\n    dest: /usr/local/bin/kubelet\n", []string{
			"F:3: artifacts[0].dest: unknown field (known: name, path, sha256, url)",
			"F:2: artifacts[0]: nothing to replace: give url, path or sha256"}},
		{"unknown top-level field", "units: {enable: [a.service]}\n", []string{
			"F:1: units: unknown field (known: artifacts, images)"}},
		{"bad sha256", "artifacts:\n  - {name: kubelet, sha256: abc}\n", []string{
			"F:2: artifacts[0].sha256: the string \"abc\" is not a sha256 (64 lower-case hex digits)"}},
		{"bad url", "artifacts:\n  - {name: kubelet, url: 127.0.0.1/kubelet}\n", []string{
			"F:2: artifacts[0].url: \"127.0.0.1/kubelet\" is not an http(s) URL"}},
		{"url and path", "artifacts:\n  - {name: kubelet, url: http://h/k, path: k}\n", []string{
			"F:2: artifacts[0].path: give either url or path, not both"}},
		{"twice", "images:\n  - {name: registry.k8s.io/pause:3.10.2, digest: " + digest + "}\n  - {name: registry.k8s.io/pause:3.10.2, digest: " + digest + "}\n", []string{
			"F:3: images[1].name: \"registry.k8s.io/pause:3.10.2\" given more than once"}},
		{"image source", "images:\n  - {name: registry.k8s.io/pause:3.10.2, source: pause}\n", []string{
			"F:2: images[0].source: \"pause\": no registry; want a reference with registry and tag or digest, like 127.0.0.1:5000/pause:3.10.2"}},
		{"image nothing", "images:\n  - {name: registry.k8s.io/pause:3.10.2}\n", []string{
			"F:2: images[0]: nothing to replace: give source or digest"}},
		{"not a list", "images: {name: x}\n", []string{"F:1: images: expected a list, got a mapping"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root, all := overlayRepo(t)
			file := write(t, filepath.Join(root, "overlay.yaml"), tt.yaml)
			ov, err := LoadProfileOverlay(file)
			if err == nil {
				err = ov.Check(all)
			}
			if err == nil {
				t.Fatalf("no error, want:\n%s", strings.Join(tt.want, "\n"))
			}
			got := strings.TrimPrefix(err.Error(), "profile overlay: ")
			if want := strings.ReplaceAll(strings.Join(tt.want, "\n"), "F:", file+":"); got != want {
				t.Errorf("error:\n got: %s\nwant: %s", got, want)
			}
		})
	}
}
