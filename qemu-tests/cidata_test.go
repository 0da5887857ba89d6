package qemutests

import (
	"os/exec"
	"strings"
	"testing"
)

// The CIDATA volume is a real ISO9660 filesystem with the label blkid (and so udev's
// /dev/disk/by-label) reports, holding user-data as written.
func TestMakeCIDATA(t *testing.T) {
	if _, err := exec.LookPath("blkid"); err != nil {
		t.Skip("blkid not installed")
	}
	p, err := makeCIDATA(t.TempDir(), map[string][]byte{"user-data": []byte("{\"ignition\":{}}\n"), "meta-data": []byte("instance-id: t\n")})
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("blkid", "-p", "-o", "export", p).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "TYPE=iso9660") || !strings.Contains(string(out), "LABEL=CIDATA") {
		t.Fatalf("blkid %s: %v\n%s", p, err, out)
	}
	if _, err := exec.LookPath("isoinfo"); err == nil {
		got, err := exec.Command("isoinfo", "-R", "-i", p, "-x", "/user-data").Output()
		if err != nil || string(got) != "{\"ignition\":{}}\n" {
			t.Fatalf("isoinfo user-data = %q, %v", got, err)
		}
	}
}
