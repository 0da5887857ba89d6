package spec

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

const sum = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

func TestLoadProfileErrors(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []string // "F" stands for the profile file, "R/" for the repository
	}{
		{"malformed", "role: worker\nartifacts:\n  - name: a\n   url: x\n", []string{
			"F:3: invalid YAML: did not find expected '-' indicator"}},
		{"role mismatch", "role: etcd\n", []string{"F:1: role: \"etcd\" does not match the file name (worker.yaml)"}},
		{"no role", "units: {}\n", []string{"F:1: role: required"}},
		{"unknown field", "role: worker\nartifacts:\n  - name: a\n    url: https://example.com/a\n    dest: /a\n    sha: " + sum + "\n", []string{
			"F:6: artifacts[0].sha: unknown field (known: checksum, dest, extract, mode, name, path, sha256, url)"}},
		{"wrong type", "role: worker\nartifacts:\n  name: a\n", []string{"F:3: artifacts: expected a list, got a mapping"}},
		{"bad sha256", "role: worker\nartifacts:\n  - name: a\n    url: https://example.com/a\n    dest: /a\n    sha256: " + sum[:63] + "\n", []string{
			"F:6: artifacts[0].sha256: \"" + sum[:63] + "\" is not a sha256 (64 lower-case hex digits)"}},
		{"upper-case sha256", "role: worker\nartifacts:\n  - name: a\n    url: https://example.com/a\n    dest: /a\n    sha256: " + strings.ToUpper(sum) + "\n", []string{
			"F:6: artifacts[0].sha256: \"" + strings.ToUpper(sum) + "\" is not a sha256 (64 lower-case hex digits)"}},
		{"url and path", "role: worker\nartifacts:\n  - name: a\n    url: https://example.com/a\n    path: a\n    dest: /a\n", []string{
			"F:5: artifacts[0].path: give either url or path, not both"}},
		{"no source no dest", "role: worker\nartifacts:\n  - name: a\n", []string{
			"F:3: artifacts[0]: one of url or path is required",
			"F:3: artifacts[0].dest: required (or extract)"}},
		{"bad url", "role: worker\nartifacts:\n  - name: a\n    url: ftp://example.com/a\n    dest: /a\n", []string{
			"F:4: artifacts[0].url: \"ftp://example.com/a\" is not an http(s) URL"}},
		{"bad checksum url", "role: worker\nartifacts:\n  - name: a\n    url: https://example.com/a\n    checksum: SHA256SUMS\n    dest: /a\n", []string{
			"F:5: artifacts[0].checksum: \"SHA256SUMS\" is not an http(s) URL of the publisher's checksum file"}},
		{"relative dest", "role: worker\nartifacts:\n  - name: a\n    path: a\n    dest: usr/bin/a\n", []string{
			"F:5: artifacts[0].dest: \"usr/bin/a\": want an absolute path in the image"}},
		{"dotdot dest", "role: worker\nartifacts:\n  - name: a\n    path: a\n    dest: /usr/../../a\n", []string{
			"F:5: artifacts[0].dest: \"/usr/../../a\": must not contain .."}},
		{"bad mode", "role: worker\nartifacts:\n  - name: a\n    path: a\n    dest: /a\n    mode: rwx\n", []string{
			"F:6: artifacts[0].mode: expected an octal mode such as \"0755\", got the string \"rwx\""}},
		{"duplicate name", "role: worker\nartifacts:\n  - {name: a, path: a, dest: /a}\n  - {name: a, path: b, dest: /b}\n", []string{
			"F:4: artifacts[1].name: \"a\" used by an earlier artifact"}},
		{"extract format unknown", "role: worker\nartifacts:\n  - name: a\n    url: https://example.com/download\n    extract:\n      files: {a: /a}\n", []string{
			"F:6: artifacts[0].extract.format: required: cannot tell the format from \"https://example.com/download\" (one of: tar, tar.gz, tar.xz, tar.zst, tar.bz2, deb)"}},
		{"extract bad format", "role: worker\nartifacts:\n  - name: a\n    path: a.zip\n    dest: /opt\n    extract: {format: zip}\n", []string{
			"F:6: artifacts[0].extract.format: \"zip\" is not an archive format (one of: tar, tar.gz, tar.xz, tar.zst, tar.bz2, deb)"}},
		{"extract files and dest", "role: worker\nartifacts:\n  - name: a\n    path: a.tar\n    dest: /opt\n    mode: \"0755\"\n    extract:\n      files: {a: /a}\n", []string{
			"F:6: artifacts[0].mode: only for plain files; extracted files keep the archive's modes",
			"F:5: artifacts[0].dest: not used with extract.files (each file names its destination)"}},
		{"extract nowhere", "role: worker\nartifacts:\n  - name: a\n    path: a.tar\n    extract: {strip: 1}\n", []string{
			"F:5: artifacts[0].extract: needs files, or a dest directory on the artifact"}},
		{"extract bad member", "role: worker\nartifacts:\n  - name: a\n    path: a.tar\n    extract:\n      files:\n        ../etc/passwd: /etc/passwd\n        b: bin/b\n", []string{
			"F:7: artifacts[0].extract.files.../etc/passwd: \"../etc/passwd\": want a relative path inside the archive",
			"F:8: artifacts[0].extract.files.b: \"bin/b\": want an absolute path in the image"}},
		{"strip type", "role: worker\nartifacts:\n  - {name: a, path: a.tar, dest: /opt, extract: {strip: one}}\n", []string{
			"F:3: artifacts[0].extract.strip: expected a number, got the string \"one\""}},
		{"units", "role: worker\nunits:\n  enable: [kubelet.service, kubelet]\n  mask: [kubelet.service]\n", []string{
			"F:3: units.enable[1]: \"kubelet\" is not a systemd unit name (like kubelet.service)",
			"F:4: units.mask[0]: \"kubelet.service\" is also in units.enable"}},
		{"missing overlay", "role: worker\noverlays: [worker]\n", []string{
			"F:2: overlays[0]: overlay worker: R/overlays/worker is not a directory"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := repo(t)
			file := write(t, filepath.Join(root, "profiles", "worker.yaml"), tt.yaml)
			_, err := loadRoleProfile(filepath.Join(root, "profiles"), "worker")
			if err == nil {
				t.Fatalf("LoadProfile succeeded, want errors:\n%s", strings.Join(tt.want, "\n"))
			}
			got := strings.TrimPrefix(err.Error(), "profile: ")
			want := strings.ReplaceAll(strings.Join(tt.want, "\n"), "F:", file+":")
			want = strings.ReplaceAll(want, "R/", root+"/")
			if got != want {
				t.Errorf("error:\n got: %s\nwant: %s", got, want)
			}
		})
	}
}

// A profile of a role that is not Kubernetes' bakes a plain node: it may have neither a
// kubernetes section nor templates, which only Kubernetes roles use.
func TestLoadProfilePlainRole(t *testing.T) {
	for _, tt := range []struct {
		name, yaml string
		want       []string // "F" stands for the profile file
	}{
		{"artifacts and units", "role: plain\nartifacts: []\nunits:\n  enable: [kiln-firstboot.service]\n", nil},
		{"kubernetes", "role: plain\nkubernetes: {version: v1.37.2}\n", []string{
			`F:2: kubernetes: role "plain" is a plain node, without Kubernetes: kiln-init configures Kubernetes for the roles worker, control-plane, etcd only`}},
		{"templates", "role: plain\ntemplates: templates/worker\n", []string{
			`F:2: templates: role "plain" is a plain node, without Kubernetes: kiln-init renders templates for the roles worker, control-plane, etcd only`}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := repo(t)
			file := write(t, filepath.Join(root, "profiles", "plain.yaml"), tt.yaml)
			p, err := loadRoleProfile(filepath.Join(root, "profiles"), "plain")
			if tt.want == nil {
				if err != nil || p.Role != "plain" {
					t.Fatalf("LoadProfile = %+v, %v", p, err)
				}
				return
			}
			want := strings.ReplaceAll(strings.Join(tt.want, "\n"), "F:", file+":")
			if err == nil || strings.TrimPrefix(err.Error(), "profile: ") != want {
				t.Errorf("error:\n got: %v\nwant: %s", err, want)
			}
		})
	}
}

func TestMissingProfile(t *testing.T) {
	root := repo(t)
	write(t, filepath.Join(root, "profiles", "etcd.yaml"), "role: etcd\n")
	write(t, filepath.Join(root, "profiles", "control-plane.yaml"), "role: control-plane\n")
	def := write(t, filepath.Join(root, "images", "q.yaml"), validBase+"profiles: ../profiles\n")
	d, err := LoadDefinition(def)
	if err != nil {
		t.Fatal(err)
	}
	prof := filepath.Join(root, "profiles")
	_, err = d.Profile("worker")
	want := def + ":6: profiles: profile for role \"worker\": " + prof + "/worker.yaml does not exist (roles: control-plane, etcd)"
	if err == nil || err.Error() != want {
		t.Errorf("Definition.Profile: got %v\nwant %s", err, want)
	}
	_, err = loadRoleProfile(prof, "worker")
	want = "profile for role \"worker\": " + prof + "/worker.yaml does not exist (roles: control-plane, etcd)"
	if err == nil || err.Error() != want {
		t.Errorf("LoadProfile: got %v\nwant %s", err, want)
	}
	if _, err := loadRoleProfile(prof, "../images/q"); err == nil || !strings.Contains(err.Error(), `role "../images/q"`) {
		t.Errorf("LoadProfile with a path as role: %v", err)
	}
	all, err := LoadProfiles(prof)
	if err != nil || len(all) != 2 || all[0].Role != "control-plane" || all[1].Role != "etcd" {
		t.Errorf("LoadProfiles = %v, %v", all, err)
	}
}

func TestLoadProfile(t *testing.T) {
	root := repo(t)
	t.Setenv("KILN_TEST_FILES", "/srv/files")
	file := write(t, filepath.Join(root, "profiles", "worker.yaml"), `role: worker
artifacts:
  - name: crictl
    url: https://example.com/crictl-v1.37.0-linux-amd64.tar.gz
    extract:
      files: {./crictl: /usr/local/bin/crictl}
  - name: cni
    url: https://example.com/cni-plugins.tgz
    sha256: sha256:`+sum+`
    dest: /opt/cni/bin/
    extract: {strip: 1}
  - name: runc
    path: bin/runc
    sha256: `+sum+`
    dest: /usr/local/sbin/runc
    mode: 0755
  - name: config
    path: ${KILN_TEST_FILES}/config.toml
    dest: /etc/containerd/config.toml
units:
  enable: [kiln-firstboot.service, containerd.service]
  mask: [apt-daily.timer]
overlays: [base]
templates: templates/worker
`)
	p, err := loadRoleProfile(filepath.Join(root, "profiles"), "worker")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "profiles")
	want := &Profile{
		File: file,
		Role: "worker",
		Artifacts: []Artifact{
			{Name: "crictl", Source: "https://example.com/crictl-v1.37.0-linux-amd64.tar.gz", URL: "https://example.com/crictl-v1.37.0-linux-amd64.tar.gz",
				Extract: &Extract{Format: "tar.gz", Files: map[string]string{"crictl": "/usr/local/bin/crictl"}}, Pos: Pos{file, 3}},
			{Name: "cni", Source: "https://example.com/cni-plugins.tgz", URL: "https://example.com/cni-plugins.tgz", SHA256: sum, Dest: "/opt/cni/bin",
				Extract: &Extract{Format: "tar.gz", Dir: "/opt/cni/bin", Strip: 1}, Pos: Pos{file, 7}},
			{Name: "runc", Source: "bin/runc", Path: filepath.Join(dir, "bin/runc"), SHA256: sum, Dest: "/usr/local/sbin/runc", Mode: 0o755, Pos: Pos{file, 12}},
			{Name: "config", Source: "${KILN_TEST_FILES}/config.toml", Path: "/srv/files/config.toml", Dest: "/etc/containerd/config.toml", Mode: fs.FileMode(0o644), Pos: Pos{file, 17}},
		},
		Units:     Units{Enable: []string{"kiln-firstboot.service", "containerd.service"}, Mask: []string{"apt-daily.timer"}},
		Overlays:  []string{filepath.Join(root, "overlays", "base")},
		Templates: filepath.Join(dir, "templates", "worker"),
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("profile:\n got %+v\nwant %+v", p, want)
		for i := range p.Artifacts {
			if !reflect.DeepEqual(p.Artifacts[i], want.Artifacts[i]) {
				t.Errorf("artifact %d:\n got %+v %+v\nwant %+v %+v", i, p.Artifacts[i], p.Artifacts[i].Extract, want.Artifacts[i], want.Artifacts[i].Extract)
			}
		}
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatal(err)
	}
}

const digest = "sha256:" + sum

func TestLoadProfileKubernetesErrors(t *testing.T) {
	k8s := "kubernetes: {version: v1.37.2}\n"
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"version unquoted number", "kubernetes:\n  version: 1.37\n", []string{
			"F:3: kubernetes.version: expected a string, got the number 1.37"}},
		{"version without v", "kubernetes:\n  version: \"1.37.2\"\n", []string{
			"F:3: kubernetes.version: \"1.37.2\" is not a Kubernetes release (like v1.37.2)"}},
		{"no version", "kubernetes:\n  runtime: containerd\n", []string{
			"F:3: kubernetes.version: required"}},
		{"bad runtime", "kubernetes:\n  version: v1.37.2\n  runtime: cri-o\n", []string{
			"F:4: kubernetes.runtime: \"cri-o\" is not a runtime (one of: containerd, docker)"}},
		{"unknown field", "kubernetes:\n  version: v1.37.2\n  cni: calico\n", []string{
			"F:4: kubernetes.cni: unknown field (known: runtime, version)"}},
		{"images without kubernetes", "images:\n  - name: registry.k8s.io/pause:3.10.2\n", []string{
			"F:3: images: pre-pulled images need a kubernetes section (its runtime imports them)"}},
		{"image name without registry", k8s + "images:\n  - name: pause:3.10.2\n", []string{
			"F:4: images[0].name: \"pause:3.10.2\": no registry; want a full name with registry and tag, like registry.k8s.io/pause:3.10.2"}},
		{"image name without tag", k8s + "images:\n  - name: registry.k8s.io/pause\n", []string{
			"F:4: images[0].name: \"registry.k8s.io/pause\": no tag; want a full name with registry and tag, like registry.k8s.io/pause:3.10.2"}},
		{"image name with digest", k8s + "images:\n  - name: registry.k8s.io/pause@" + digest + "\n", []string{
			"F:4: images[0].name: \"registry.k8s.io/pause@" + digest + "\": a name has a tag, not a digest (give the digest as digest:); want a full name with registry and tag, like registry.k8s.io/pause:3.10.2"}},
		{"bad digest", k8s + "images:\n  - name: registry.k8s.io/pause:3.10.2\n    digest: sha256:abc\n", []string{
			"F:5: images[0].digest: \"sha256:abc\" is not a digest (sha256: and 64 lower-case hex digits)"}},
		{"source digest differs", k8s + "images:\n  - name: registry.k8s.io/pause:3.10.2\n    digest: " + digest + "\n    source: 127.0.0.1:5000/pause@sha256:" + strings.Repeat("1", 64) + "\n", []string{
			"F:6: images[0].source: digest sha256:" + strings.Repeat("1", 64) + " differs from digest: " + digest}},
		{"duplicate image", k8s + "images:\n  - name: registry.k8s.io/pause:3.10.2\n  - {name: registry.k8s.io/pause:3.10.2}\n", []string{
			"F:5: images[1].name: \"registry.k8s.io/pause:3.10.2\" used by an earlier image"}},
		{"image name with bad tag", k8s + "images:\n  - name: registry.k8s.io/pause:3.10.2!\n", []string{
			"F:4: images[0].name: \"registry.k8s.io/pause:3.10.2!\": tag can only contain the characters `abcdefghijklmnopqrstuvwxyz0123456789_-.ABCDEFGHIJKLMNOPQRSTUVWXYZ`: 3.10.2!; want a full name with registry and tag, like registry.k8s.io/pause:3.10.2"}},
		{"bad source", k8s + "images:\n  - name: registry.k8s.io/pause:3.10.2\n    source: pause\n", []string{
			"F:5: images[0].source: \"pause\": no registry; want a reference with registry and tag or digest, like 127.0.0.1:5000/pause:3.10.2"}},
		{"source without tag", k8s + "images:\n  - name: registry.k8s.io/pause:3.10.2\n    source: 127.0.0.1:5000/pause\n", []string{
			"F:5: images[0].source: \"127.0.0.1:5000/pause\": no tag or digest; want a reference with registry and tag or digest, like 127.0.0.1:5000/pause:3.10.2"}},
		{"image without name", k8s + "images:\n  - source: registry.k8s.io/pause:3.10.2\n", []string{
			"F:4: images[0].name: required"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := repo(t)
			file := write(t, filepath.Join(root, "profiles", "worker.yaml"), "role: worker\n"+tt.yaml)
			_, err := loadRoleProfile(filepath.Join(root, "profiles"), "worker")
			if err == nil {
				t.Fatalf("LoadProfile succeeded, want errors:\n%s", strings.Join(tt.want, "\n"))
			}
			got := strings.TrimPrefix(err.Error(), "profile: ")
			want := strings.ReplaceAll(strings.Join(tt.want, "\n"), "F:", file+":")
			if got != want {
				t.Errorf("error:\n got: %s\nwant: %s", got, want)
			}
		})
	}
}

func TestLoadProfileKubernetes(t *testing.T) {
	root := repo(t)
	file := write(t, filepath.Join(root, "profiles", "worker.yaml"), `role: worker
kubernetes:
  version: v1.37.2
images:
  - name: registry.k8s.io/pause:3.10.2
  - name: registry.k8s.io/kube-proxy:v1.37.2
    source: 127.0.0.1:5000/kube-proxy:v1.37.2
    digest: `+digest+`
  - name: registry.k8s.io/coredns/coredns:v1.15.0
    source: mirror.example.com/coredns@`+digest+`
`)
	p, err := loadRoleProfile(filepath.Join(root, "profiles"), "worker")
	if err != nil {
		t.Fatal(err)
	}
	wantK := &Kubernetes{Version: "v1.37.2", Runtime: "containerd", Pos: Pos{file, 3}}
	if !reflect.DeepEqual(p.Kubernetes, wantK) {
		t.Errorf("kubernetes = %+v, want %+v", p.Kubernetes, wantK)
	}
	wantI := []Image{
		{Name: "registry.k8s.io/pause:3.10.2", Source: "registry.k8s.io/pause:3.10.2", Pos: Pos{file, 5}},
		{Name: "registry.k8s.io/kube-proxy:v1.37.2", Source: "127.0.0.1:5000/kube-proxy:v1.37.2", Digest: digest, Pos: Pos{file, 6}},
		{Name: "registry.k8s.io/coredns/coredns:v1.15.0", Source: "mirror.example.com/coredns@" + digest, Digest: digest, Pos: Pos{file, 9}},
	}
	if !reflect.DeepEqual(p.Images, wantI) {
		t.Errorf("images:\n got %+v\nwant %+v", p.Images, wantI)
	}
	for i, tag := range []string{"3.10.2", "v1.37.2", "v1.15.0"} {
		if got := p.Images[i].Tag(); got != tag {
			t.Errorf("Tag() of %s = %q, want %q", p.Images[i].Name, got, tag)
		}
	}
}
