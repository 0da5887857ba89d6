package qemutests

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/vm"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// testKey is a throwaway public key: the test checks it lands in authorized_keys.
const testKey = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIHk3Lq1o7tJ8VdBHrS1a2Wm9QeHh3hQk4b0aL8cY0fJ9 kiln-test"

// probeUnit prints, on the console, what the config did: the file's content, the user's id and
// how many ssh keys it has. It is enabled by the config, so it also proves units are applied.
const probeUnit = `[Unit]
Description=kiln test probe
After=kiln-firstboot.service
[Service]
Type=oneshot
ExecStart=/bin/sh -c 'echo "kiln-probe: source=$(cat /etc/kiln/source.txt) uid=$(id -u kiln) keys=$(grep -c ssh- /home/kiln/.ssh/authorized_keys)"'
StandardOutput=journal+console
[Install]
WantedBy=multi-user.target
`

func ignitionConfig(source string) []byte {
	return []byte(fmt.Sprintf(`{"ignition":{"version":"3.4.0"},
 "passwd":{"users":[{"name":"kiln","sshAuthorizedKeys":[%q],"groups":["adm"]}]},
 "storage":{"files":[{"path":"/etc/kiln/source.txt","mode":420,"contents":{"source":"data:,%s"}}]},
 "systemd":{"units":[{"name":"kiln-probe.service","enabled":true,"contents":%q}]}}`, testKey, source, probeUnit))
}

func butaneConfig(source string) []byte {
	var unit strings.Builder
	for _, l := range strings.Split(strings.TrimSuffix(probeUnit, "\n"), "\n") {
		unit.WriteString("        " + l + "\n")
	}
	return []byte(fmt.Sprintf(`variant: fcos
version: 1.6.0
passwd:
  users:
    - name: kiln
      groups: [adm]
      ssh_authorized_keys:
        - %s
storage:
  files:
    - path: /etc/kiln/source.txt
      mode: 0644
      contents:
        inline: %s
systemd:
  units:
    - name: kiln-probe.service
      enabled: true
      contents: |
%s`, testKey, source, unit.String()))
}

// probeLine matches the probe's report, or first boot failing (so a failure ends the wait
// at once; assertFirstboot then reports it).
func probeLine(source string) *regexp.Regexp {
	return regexp.MustCompile(probeOK(source).String() + `|` + firstbootFailed)
}

func probeOK(source string) *regexp.Regexp {
	return regexp.MustCompile(`kiln-probe: source=` + source + ` uid=\d+ keys=1`)
}

// The first-boot config reaches the node through each source a QEMU or bare-metal user has:
// QEMU fw_cfg (Butane YAML, translated in the guest), kiln.config.url= on the kernel command line
// (Ignition served by this test process, ${mac} substituted) and a CIDATA volume (gzip'd
// Ignition). Each writes a file, creates a user with an ssh key and enables a unit that reports
// both on the console. The root filesystem does not matter here, so these are the boots whose
// image is erofs: stage 1 must say it mounted erofs.
func TestConfigSources(t *testing.T) {
	top := newEnv(t)
	useEROFS(t, filepath.Join(top.repo, "images", "qemu.yaml"))
	baked := top.bake("qemu", "worker")
	// sub gives a subtest the environment with its own *testing.T.
	sub := func(t *testing.T) *env { e := *top; e.t = t; return &e }
	fresh := func(t *testing.T, name string) string {
		p := filepath.Join(top.dir, name+".raw")
		copySparse(t, baked, p)
		return p
	}

	t.Run("fw_cfg butane", func(t *testing.T) {
		e := sub(t)
		cfg := filepath.Join(t.TempDir(), "node.bu")
		if err := os.WriteFile(cfg, butaneConfig("fwcfg"), 0o600); err != nil {
			t.Fatal(err)
		}
		m, _ := e.bootWith(vm.Config{Image: fresh(t, "fwcfg"), Config: cfg}, probeLine("fwcfg"), 10*time.Minute)
		assertFirstboot(t, m, "fw_cfg", "fwcfg")
	})

	t.Run("kernel cmdline url", func(t *testing.T) {
		e := sub(t)
		var mu sync.Mutex
		var paths []string
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			paths = append(paths, r.URL.Path)
			mu.Unlock()
			if r.URL.Path != "/nodes/52:54:00:12:34:56.ign" {
				http.NotFound(w, r)
				return
			}
			w.Write(ignitionConfig("url"))
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		port := ln.Addr().(*net.TCPAddr).Port
		img := fresh(t, "url")
		boot, err := vm.ExtractBoot(t.Context(), img, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		// QEMU's user network shows the host's loopback to the guest as 10.0.2.2.
		m, _ := e.bootWith(vm.Config{Image: img, Boot: boot,
			Append: fmt.Sprintf("kiln.config.url=http://10.0.2.2:%d/nodes/${mac}.ign", port)}, probeLine("url"), 10*time.Minute)
		assertFirstboot(t, m, "cmdline-url", "url")
		mu.Lock()
		defer mu.Unlock()
		if len(paths) == 0 || paths[0] != "/nodes/52:54:00:12:34:56.ign" {
			t.Errorf("the config server saw %v, want the MAC substituted into the path", paths)
		}
	})

	t.Run("cidata gzip", func(t *testing.T) {
		e := sub(t)
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		zw.Write(ignitionConfig("cidata"))
		zw.Close()
		iso, err := makeCIDATA(t.TempDir(), map[string][]byte{"user-data": gz.Bytes(), "meta-data": []byte("instance-id: kiln-test\n")})
		if err != nil {
			t.Fatal(err)
		}
		m, _ := e.bootWith(vm.Config{Image: fresh(t, "cidata"), Disks: []vm.Disk{{Name: "cidata", Path: iso}}}, probeLine("cidata"), 10*time.Minute)
		assertFirstboot(t, m, "cidata", "cidata")
	})
}

// assertFirstboot checks that stage 1 mounted an erofs root, that the first-boot status line
// named the source and reported success, and that the config's probe unit reported the file,
// user and key.
func assertFirstboot(t *testing.T, m *vm.Machine, source, probe string) {
	t.Helper()
	m.Stop()
	if i := slices.IndexFunc(m.Lines(), rootMounted.MatchString); i < 0 || !strings.Contains(m.Lines()[i], " fstype=erofs") {
		t.Errorf("stage 1 did not mount an erofs root:\n%s", tail(m.Lines(), 30))
	}
	if !slices.ContainsFunc(m.Lines(), probeOK(probe).MatchString) {
		t.Errorf("no probe report for %s", probe)
	}
	for _, l := range m.Lines() {
		if st, ok := nodeimage.ParseStatusLine(l); ok && st.Outcome == nodeimage.OutcomeOK {
			if !strings.Contains(st.Detail, "source="+source) {
				t.Errorf("status line %q does not name source %s", l, source)
			}
			return
		}
	}
	t.Errorf("no 'kiln-init: firstboot ok' line on the console:\n%s", tail(m.Lines(), 30))
}

// rootMounted is stage 1's line naming the root filesystem type it mounted.
var rootMounted = regexp.MustCompile(`msg="root mounted".* fstype=`)

// useEROFS switches an image definition to an erofs root filesystem.
func useEROFS(t *testing.T, def string) {
	t.Helper()
	b, err := os.ReadFile(def)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for field, value := range map[string]string{"rootfs": "erofs", "compression": "lz4hc"} {
		re := regexp.MustCompile(`(?m)^(\s+` + field + `:) *\S+`)
		if !re.MatchString(s) {
			t.Fatalf("%s has no disk.%s line", def, field)
		}
		s = re.ReplaceAllString(s, "${1} "+value)
	}
	if err := os.WriteFile(def, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}
