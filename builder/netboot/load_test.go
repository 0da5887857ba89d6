package netboot

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// mkfifo replaces p with a FIFO that nothing writes to.
func mkfifo(t *testing.T, p string) {
	t.Helper()
	os.Remove(p)
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
}

// A machines.yaml with a mistake is refused with its file, line and field.
func TestMachinesErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       []string
	}{
		{"unknown field", "groups:\n  - name: a\n    image: metal-worker\n    mode: live\n    selectr: {mac: 52:54:00:00:00:01}\n",
			[]string{"machines.yaml:5: groups[0].selectr: unknown field (known: config, image, install, kernelArgs, machines, mode, name, selector)"}},
		{"unknown top-level field", "group: []\n", []string{"machines.yaml:1: group: unknown field", "groups: required"}},
		{"MAC claimed twice, in two spellings", `groups:
  - name: a
    image: metal-worker
    mode: live
    selector: {mac: 52:54:00:00:00:01}
  - name: b
    image: metal-worker
    mode: live
    machines:
      - name: b1
        selector: {mac: 52-54-00-00-00-01}
`, []string{"machines.yaml:11: groups[1].machines[0].selector.mac: mac 52:54:00:00:00:01 is already claimed by groups[0].selector.mac (line 5)"}},
		{"UUID claimed twice in one list", "groups:\n  - name: a\n    image: metal-worker\n    mode: live\n    selector:\n      uuid:\n        - 8a4e3c2b-0000-4000-8000-000000000003\n        - 8A4E3C2B-0000-4000-8000-000000000003\n",
			[]string{"machines.yaml:8: groups[0].selector.uuid[1]: uuid 8a4e3c2b-0000-4000-8000-000000000003 is already claimed by groups[0].selector.uuid[0] (line 7)"}},
		{"bad MAC", "groups:\n  - name: a\n    image: metal-worker\n    mode: live\n    selector: {mac: 52:54:00}\n",
			[]string{`machines.yaml:5: groups[0].selector.mac: "52:54:00" is not a MAC address`}},
		{"placeholder UUID", "groups:\n  - name: a\n    image: metal-worker\n    mode: live\n    selector: {uuid: 00000000-0000-0000-0000-000000000000}\n",
			[]string{"machines.yaml:5: groups[0].selector.uuid: 00000000-0000-0000-0000-000000000000 is what firmware without a UUID reports"}},
		{"bad mode, missing image", "groups:\n  - name: a\n    mode: diskless\n    selector: {mac: 52:54:00:00:00:01}\n",
			[]string{`machines.yaml:2: groups[0].image: required`, `machines.yaml:3: groups[0].mode: "diskless" is not a mode (live or install)`}},
		{"install settings on a live group", "groups:\n  - name: a\n    image: metal-worker\n    mode: live\n    install: {dev: auto}\n    selector: {mac: 52:54:00:00:00:01}\n",
			[]string{"machines.yaml:5: groups[0].install: only for mode: install"}},
		{"bad install dev and wipe", "groups:\n  - name: a\n    image: metal-worker\n    mode: install\n    install: {dev: /dev/../etc, wipe: yes}\n    selector: {mac: 52:54:00:00:00:01}\n",
			[]string{`machines.yaml:5: groups[0].install.dev: "/dev/../etc" is not auto`, `machines.yaml:5: groups[0].install.wipe: expected true or false, got the string "yes"`}},
		{"image with a path", "groups:\n  - name: a\n    image: ../etc/metal-worker\n    mode: live\n    selector: {mac: 52:54:00:00:00:01}\n",
			[]string{`machines.yaml:3: groups[0].image: "../etc/metal-worker" is not a plain file name`}},
		{"reserved kernel argument", "groups:\n  - name: a\n    image: metal-worker\n    mode: live\n    kernelArgs: quiet kiln.config.url=http://x/\n    selector: {mac: 52:54:00:00:00:01}\n",
			[]string{`machines.yaml:5: groups[0].kernelArgs: "kiln.config.url=http://x/": kiln serve sets kiln.config.url=… itself`}},
		{"name used twice", "groups:\n  - name: a\n    image: metal-worker\n    mode: live\n    machines:\n      - name: a\n        selector: {hostname: a}\n",
			[]string{`machines.yaml:6: groups[0].machines[0]: name "a" is already used by groups[0].name (line 2)`}},
		{"group selecting nothing", "groups:\n  - name: a\n    image: metal-worker\n    mode: live\n    selector: {}\n",
			[]string{"machines.yaml:5: groups[0].selector: selects nothing"}},
		{"machine without a name", "groups:\n  - name: a\n    image: metal-worker\n    mode: live\n    machines:\n      - selector: {mac: 52:54:00:00:00:01}\n",
			[]string{"machines.yaml:6: groups[0].machines[0]: needs a name or a hostname"}},
		{"not YAML", "groups: [\n", []string{"machines.yaml:", "invalid YAML"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseMachines([]byte(tc.yaml), "machines.yaml")
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// serve does not start when a file a machine would be handed is missing or differs from
// what the bake recorded, or when a config is bad: the error names the file.
func TestLoadRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(t *testing.T, dir string)
		want   []string
	}{
		{"rootfs changed since the bake", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "metal-worker-pxe", "rootfs.img"), "tampered")
		}, []string{"machines.yaml:3: groups[0].image: image metal-worker: ", "metal-worker-pxe/rootfs.img: sha256 ", "was recorded: the file changed since the bake"}},
		{"kernel missing", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "metal-control-plane-pxe", "vmlinuz"))
		}, []string{"machines.yaml:14: groups[1].image: image metal-control-plane: ", "metal-control-plane-pxe/vmlinuz: no such file"}},
		{"raw image changed", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "metal-control-plane.raw"), "x")
		}, []string{"machines.yaml:16: groups[1].install: ", "metal-control-plane.raw: sha256"}},
		{"no metadata", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "metal-worker.json"))
		}, []string{"groups[0].image: image metal-worker: stat ", "metal-worker.json: no such file"}},
		{"bad Butane config", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "cp.bu"), "variant: fcos\nversion: 1.6.0\nstorage:\n  filez: []\n")
		}, []string{"machines.yaml:17: groups[1].config: ", "cp.bu: parse config: ", "filez", "line 4"}},
		{"bad node.yaml in the config", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "cp.bu"), strings.Replace(cpButane, "role: control-plane", "role: control-plane\n          hostnme: x", 1))
		}, []string{"machines.yaml:17: groups[1].config: ", "cp.bu: /etc/kiln/node.yaml:", "hostnme: unknown field"}},
		{"etcd member not among the members", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "cp.bu"), strings.Replace(cpButane, "[a, b, c]", "[a, c]", 1))
		}, []string{"machines.yaml:23: groups[1].machines[1]: config of machine cp-2: /etc/kiln/node.yaml:5: ", `etcd.member: "b" is not one of etcd.members (a, c)`}},
		{"etcd member without a node.yaml", func(t *testing.T, dir string) {
			writeFile(t, filepath.Join(dir, "cp.bu"), "variant: fcos\nversion: 1.6.0\n")
		}, []string{"groups[1].machines[0]: machine cp-1: etcdMember a needs a node config with etcd.members", "cp.bu writes no /etc/kiln/node.yaml"}},
		{"config missing", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "worker.ign"))
		}, []string{"machines.yaml:5: groups[0].config: stat ", "worker.ign: no such file"}},
		// A FIFO is refused, not opened: opening one waits for a writer.
		{"a FIFO as a pxe file", func(t *testing.T, dir string) {
			mkfifo(t, filepath.Join(dir, "metal-worker-pxe", "rootfs.img"))
		}, []string{"machines.yaml:3: groups[0].image: image metal-worker: ", "metal-worker-pxe/rootfs.img is a FIFO, not a regular file"}},
		{"a FIFO as the metadata", func(t *testing.T, dir string) {
			mkfifo(t, filepath.Join(dir, "metal-worker.json"))
		}, []string{"machines.yaml:3: groups[0].image: image metal-worker: ", "metal-worker.json is a FIFO, not a regular file"}},
		{"a FIFO as a config", func(t *testing.T, dir string) {
			mkfifo(t, filepath.Join(dir, "worker.ign"))
		}, []string{"machines.yaml:5: groups[0].config: ", "worker.ign is a FIFO, not a regular file"}},
		{"a FIFO as machines.yaml", func(t *testing.T, dir string) {
			mkfifo(t, filepath.Join(dir, "machines.yaml"))
		}, []string{"machines: ", "machines.yaml is a FIFO, not a regular file"}},
		{"a directory as the install image", func(t *testing.T, dir string) {
			os.Remove(filepath.Join(dir, "metal-control-plane.raw"))
			os.Mkdir(filepath.Join(dir, "metal-control-plane.raw"), 0o755)
		}, []string{"machines.yaml:16: groups[1].install: ", "metal-control-plane.raw is a directory, not a regular file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := fixture(t)
			tc.break_(t, dir)
			done := make(chan error, 1)
			go func() { _, err := Load(Options{Dir: dir}); done <- err }()
			var err error
			select {
			case err = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("Load did not return: it waits on a file")
			}
			if err == nil {
				t.Fatal("Load succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// A compressed install image the bake did not write is served with the digest beside it,
// and refused without one.
func TestCompressedInstallImage(t *testing.T) {
	dir := fixture(t)
	yaml := strings.Replace(machinesYAML, "install: {dev: auto, wipe: true}", "install: {dev: auto, wipe: true, image: metal-control-plane.raw.zst}", 1)
	writeFile(t, filepath.Join(dir, "machines.yaml"), yaml)
	writeFile(t, filepath.Join(dir, "metal-control-plane.raw.zst"), "pretend zstd")
	if _, err := Load(Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), "metal-control-plane.raw.zst: not among metal-control-plane.json's outputs, and no digest beside it") {
		t.Fatalf("without a digest: %v", err)
	}
	writeFile(t, filepath.Join(dir, "metal-control-plane.raw.zst.sha256"), strings.Repeat("0", 64)+"  metal-control-plane.raw.zst\n")
	if _, err := Load(Options{Dir: dir}); err == nil || !strings.Contains(err.Error(), "the file changed since the bake") {
		t.Fatalf("with a wrong digest: %v", err)
	}
	sum := sha256Hex("pretend zstd")
	writeFile(t, filepath.Join(dir, "metal-control-plane.raw.zst.sha256"), sum+"  metal-control-plane.raw.zst\n")
	ts, _ := startServer(t, Options{Dir: dir})
	_, body := get(t, ts.URL+"/boot.ipxe?mac=52-54-00-00-01-01", "boot.example")
	contains(t, "script", body, "kiln.install.image_url=http://boot.example/images/metal-control-plane.raw.zst kiln.install.image_sha256="+sum)
}

// An --advertise-url that cannot go into a kernel command line is refused.
func TestAdvertiseURL(t *testing.T) {
	for _, u := range []string{"ftp://x/", "http://", "http://x/?a=b", "http://x/a b", "10.0.0.1:8080"} {
		if _, err := CheckAdvertiseURL(u); err == nil {
			t.Errorf("%q accepted", u)
		}
	}
	if got, err := CheckAdvertiseURL("https://boot.example/pxe/"); err != nil || got != "https://boot.example/pxe" {
		t.Errorf("got %q, %v", got, err)
	}
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}
