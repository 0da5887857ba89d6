package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// kiln check-config finds the image's metadata from any output, passes a config the image can
// take and names the config, the image and each field of one it cannot; a run of that image
// with that config refuses it before booting.
func TestCheckConfig(t *testing.T) {
	dir := t.TempDir()
	md := nodeimage.Metadata{Name: "qemu", Role: "worker", Platform: "qemu", Contents: &nodeimage.Contents{
		Writable: []string{"/etc", "/var", "/usr/local", "/opt", "/home", "/root"},
		Users:    []string{"root"}, Groups: []string{"root", "sudo", "wheel"},
		Units: []string{"containerd.service", "ssh.service"}}}
	data, _ := json.Marshal(md)
	mdFile := filepath.Join(dir, "qemu-worker.json")
	os.WriteFile(mdFile, data, 0o644)
	img := filepath.Join(dir, "qemu-worker.qcow2")
	os.WriteFile(img, make([]byte, 4096), 0o644)
	old := filepath.Join(dir, "old-worker.json")
	md.Contents = nil
	data, _ = json.Marshal(md)
	os.WriteFile(old, data, 0o644)

	good := filepath.Join(dir, "good.bu")
	os.WriteFile(good, []byte("variant: fcos\nversion: 1.7.0\npasswd:\n  users:\n    - name: core\n      groups: [wheel]\n"+
		"storage:\n  files:\n    - path: /opt/app/conf\n      contents: {inline: x}\nsystemd:\n  units:\n    - name: ssh.service\n      enabled: true\n"), 0o644)
	bad := filepath.Join(dir, "bad.bu")
	os.WriteFile(bad, []byte("variant: fcos\nversion: 1.7.0\npasswd:\n  users:\n    - name: core\n      groups: [docker]\n"+
		"storage:\n  files:\n    - path: /usr/lib/app.conf\n      contents: {inline: x}\n  filesystems:\n    - device: /dev/vdc\n      format: swap\n"+
		"systemd:\n  units:\n    - name: podman.service\n      enabled: true\n"), 0o644)

	for _, image := range []string{mdFile, img} {
		out, err := kiln(t, "check-config", good, "--image", image)
		if err != nil || !strings.Contains(out, "good.bu: ok for qemu-worker.json (qemu, role worker)") {
			t.Errorf("check-config good.bu --image %s: %v\n%s", image, err, out)
		}
	}
	_, err := kiln(t, "check-config", bad, "--image", img)
	for _, want := range []string{"bad.bu against " + mdFile,
		`passwd.users[0].groups[0]: group "docker" is neither in the image nor in passwd.groups`,
		"storage.files[0].path: /usr/lib/app.conf is on the image's read-only root",
		"systemd.units[0].enabled: podman.service is not a unit the image ships",
		"storage.filesystems[0].format: swap is refused on this worker node: kubelet runs there"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("check-config bad.bu: %v\nwant it to say %q", err, want)
		}
	}
	// Merged in order, as kiln run merges them: the second file's error is the merged config's.
	if _, err := kiln(t, "check-config", good, bad, "--image", img); err == nil || !strings.Contains(err.Error(), good+" + "+bad+" against") {
		t.Errorf("check-config good.bu bad.bu: %v", err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"check-config", good}, "--image: name the image"},
		{[]string{"check-config", good, "--image", filepath.Join(dir, "node.img")}, "not an image output"},
		{[]string{"check-config", good, "--image", filepath.Join(dir, "gone.raw")}, "gone.json: the image metadata the bake writes beside its outputs is missing"},
		{[]string{"check-config", good, "--image", old}, "no contents recorded"},
		{[]string{"check-config", filepath.Join(dir, "missing.bu"), "--image", img}, "missing.bu: no such file"},
	} {
		if _, err := kiln(t, tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("kiln %s: %v, want %q", strings.Join(tc.args, " "), err, tc.want)
		}
	}
	// kiln run checks the same before it boots anything.
	if _, err := kiln(t, "run", img, "--config", bad, "--accel", "tcg", "--snapshot"); err == nil ||
		!strings.Contains(err.Error(), "--config "+bad+" against "+mdFile) || !strings.Contains(err.Error(), "podman.service") {
		t.Errorf("kiln run --config bad.bu: %v, want the image check's findings", err)
	}
}
