package bake

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// The contents recorded for a tree: where a node writes (what stage 1 makes writable in that
// tree), the names in passwd and group, the unit files (masked ones and .wants dirs left out).
func TestImageContents(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lay      func(root string)
		writable []string
	}{
		{"default base", func(root string) {
			mkdirs(t, root, "usr/local", "opt", "var/home", "var/roothome")
			os.Symlink("var/home", filepath.Join(root, "home"))
			os.Symlink("var/roothome", filepath.Join(root, "root"))
		}, []string{"/etc", "/usr/local", "/opt", "/var", "/home", "/root"}},
		{"no /opt, /home a directory", func(root string) {
			mkdirs(t, root, "usr/local", "home", "root")
		}, []string{"/etc", "/usr/local", "/var"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			mkdirs(t, root, "etc/systemd/system/multi-user.target.wants", "usr/lib/systemd/system")
			os.WriteFile(filepath.Join(root, "etc/passwd"), []byte("root:x:0:0:root:/root:/bin/bash\nsshd:x:100:65534::/run/sshd:/usr/sbin/nologin\n"), 0o644)
			os.WriteFile(filepath.Join(root, "etc/group"), []byte("root:x:0:\nsudo:x:27:\nwheel:x:998:\n"), 0o644)
			for _, u := range []string{"ssh.service", "getty@.service", "systemd-networkd.socket", "README"} {
				os.WriteFile(filepath.Join(root, "usr/lib/systemd/system", u), []byte("[Unit]\n"), 0o644)
			}
			os.Symlink("/usr/lib/systemd/system/ssh.service", filepath.Join(root, "etc/systemd/system/sshd.service"))
			os.Symlink("/dev/null", filepath.Join(root, "etc/systemd/system/apt-daily.timer"))
			mkdirs(t, root, "usr/bin", "usr/lib/systemd/system-generators")
			os.Symlink("usr/bin", filepath.Join(root, "bin"))
			os.Symlink("usr/lib", filepath.Join(root, "lib"))
			os.Symlink("/etc", filepath.Join(root, "sbin")) // not into /usr: no alias
			os.WriteFile(filepath.Join(root, "usr/bin/kubelet"), []byte("ELF"), 0o755)
			os.WriteFile(filepath.Join(root, "usr/bin/README"), []byte("not a program"), 0o644)
			os.Symlink("/etc/alternatives/vi", filepath.Join(root, "usr/bin/vi"))
			os.WriteFile(filepath.Join(root, "usr/lib/systemd/system-generators/systemd-fstab-generator"), []byte("ELF"), 0o755)
			tc.lay(root)
			c, err := imageContents(root)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.Writable, tc.writable) {
				t.Errorf("writable %v, want %v", c.Writable, tc.writable)
			}
			if !slices.Equal(c.Users, []string{"root", "sshd"}) || !slices.Equal(c.Groups, []string{"root", "sudo", "wheel"}) {
				t.Errorf("users %v groups %v", c.Users, c.Groups)
			}
			if want := []string{"getty@.service", "ssh.service", "sshd.service", "systemd-networkd.socket"}; !slices.Equal(c.Units, want) {
				t.Errorf("units %v, want %v", c.Units, want)
			}
			if want := []string{"/usr/bin", "/usr/lib/systemd", "/usr/lib/systemd/system-generators"}; !slices.Equal(c.ProgramDirs, want) {
				t.Errorf("program dirs %v, want %v", c.ProgramDirs, want)
			}
			if want := []string{"/usr/bin/kubelet", "/usr/bin/vi", "/usr/lib/systemd/system-generators/systemd-fstab-generator"}; !slices.Equal(c.Programs, want) {
				t.Errorf("programs %v, want %v", c.Programs, want)
			}
			if want := map[string]string{"/bin": "/usr/bin", "/lib": "/usr/lib"}; !maps.Equal(c.Links, want) {
				t.Errorf("links %v, want %v", c.Links, want)
			}
			for p, lacks := range map[string]bool{"/bin/kubelet": false, "/usr/bin/podman": true, "/bin/podman": true,
				"/usr/lib/systemd/system-generators/podman-system-generator": true, "/opt/bin/tool": false, "/usr/local/bin/podman": false} {
				if _, got := c.LacksProgram(p); got != lacks {
					t.Errorf("LacksProgram(%s) = %v, want %v", p, got, lacks)
				}
			}
		})
	}
}

func mkdirs(t *testing.T, root string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// A tree whose /etc/passwd links out of it is refused rather than read from the host.
func TestImageContentsStaysInTheTree(t *testing.T) {
	root := t.TempDir()
	mkdirs(t, root, "etc")
	os.Symlink("/etc/passwd", filepath.Join(root, "etc/passwd"))
	if c, err := imageContents(root); err == nil {
		t.Fatalf("imageContents followed /etc/passwd out of the tree: users %v", c.Users)
	}
}
