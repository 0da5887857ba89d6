package config

import (
	"slices"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// The default base's contents, as the bake records them (abridged).
var testImage = nodeimage.Contents{
	Writable:    []string{"/etc", "/var", "/usr/local", "/opt", "/home", "/root"},
	Users:       []string{"root", "daemon", "nobody", "sshd"},
	Groups:      []string{"root", "adm", "sudo", "wheel", "users", "systemd-journal"},
	Units:       []string{"containerd.service", "getty@.service", "kubelet.service", "ssh.service", "systemd-networkd.service"},
	ProgramDirs: []string{"/usr/bin", "/usr/sbin", "/usr/libexec", "/usr/lib/systemd", "/usr/lib/systemd/system-generators"},
	Programs: []string{"/usr/bin/containerd", "/usr/bin/kubelet", "/usr/bin/sh", "/usr/sbin/agetty", "/usr/sbin/sshd",
		"/usr/lib/systemd/systemd-networkd", "/usr/lib/systemd/system-generators/systemd-fstab-generator"},
	Links: map[string]string{"/bin": "/usr/bin", "/sbin": "/usr/sbin", "/lib": "/usr/lib"},
}

// A config that would fail at first boot on the image fails the check, naming each field;
// one the image can take passes.
func TestCheckImage(t *testing.T) {
	for _, tc := range []struct {
		name, bu string
		want     []string // one per finding; none means the config passes
	}{
		{"what FCOS docs write", `passwd:
  users:
    - name: core
      groups: [wheel, sudo]
      ssh_authorized_keys: ["` + edKey + `"]
storage:
  files:
    - path: /etc/sysctl.d/90-vm.conf
      contents: {inline: "vm.swappiness=10\n"}
    - path: /usr/local/bin/hello
      mode: 0755
      contents: {inline: "#!/bin/sh\necho hello\n"}
    - path: /opt/tools/README
      contents: {inline: "tools\n"}
    - path: /etc/systemd/system/hello.service
      contents: {inline: "[Service]\nExecStart=/usr/local/bin/hello\n[Install]\nWantedBy=multi-user.target\n"}
  directories:
    - path: /var/lib/app
      user: {name: core}
systemd:
  units:
    - name: hello.service
      enabled: true
    - name: ssh.service
      enabled: true
    - name: getty@ttyS1.service
      enabled: true
    - name: kubelet.service
      dropins:
        - name: 10-extra.conf
          contents: "[Service]\nEnvironment=X=1\n"
    - name: podman.service
      mask: true
    - name: tool.service
      contents: |
        [Service]
        ExecStartPre=/bin/sh -c 'curl -o /opt/bin/tool https://example.com/tool'
        ExecStart=/opt/bin/tool --serve
        ExecStop=%h/bin/stop
`, nil},
		{"programs the image lacks", `storage:
  files:
    - path: /etc/NetworkManager/system-connections/ens2.nmconnection
      contents: {inline: x}
    - path: /etc/NetworkManager/conf.d/dns.conf
      contents: {inline: x}
    - path: /etc/containers/systemd/hello.container
      contents: {inline: x}
    - path: /etc/systemd/network/10-ens2.network
      contents: {inline: x}
systemd:
  units:
    - name: hello.service
      enabled: true
      contents: |
        [Service]
        ExecStartPre=-/bin/podman kill busybox1
        ExecStartPre=/usr/bin/podman pull busybox
        ExecStart=/usr/bin/sh -c 'podman run busybox'
    - name: kubelet.service
      dropins:
        - name: 20-wrap.conf
          contents: "[Service]\nExecStart=\nExecStart=@/usr/libexec/kubelet-wrapper kubelet\n"
`, []string{
			"storage.files[0].path: /etc/NetworkManager/system-connections/ens2.nmconnection is read by NetworkManager (/usr/sbin/NetworkManager), which is not in the image: the config would do nothing; the image configures its network with systemd-networkd (.network files in /etc/systemd/network) (1 more fields write there)",
			"storage.files[2].path: /etc/containers/systemd/hello.container is read by podman's quadlet generator (/usr/lib/systemd/system-generators/podman-system-generator), which is not in the image: the config would do nothing",
			"systemd.units[0].contents: line 2: ExecStartPre runs /bin/podman (/usr/bin/podman), which is not in the image; /usr/bin is on its read-only root, where a node cannot add it (1 more lines run it)",
			"systemd.units[1].dropins[0].contents: line 3: ExecStart runs /usr/libexec/kubelet-wrapper, which is not in the image; /usr/libexec is on its read-only root, where a node cannot add it",
		}},
		{"read-only root", `storage:
  files:
    - path: /usr/bin/tool
      contents: {inline: x}
  directories:
    - path: /srv/data
  links:
    - path: /bin/python
      target: /usr/bin/python3
`, []string{
			"storage.files[0].path: /usr/bin/tool is on the image's read-only root; a node writes only below /etc, /var, /usr/local, /opt, /home, /root",
			"storage.directories[0].path: /srv/data is on the image's read-only root",
			"storage.links[0].path: /bin/python is on the image's read-only root",
		}},
		{"groups and owners", `passwd:
  groups:
    - name: app
  users:
    - name: ops
      primary_group: app
      groups: [wheel, docker]
    - name: svc
      home_dir: /srv/svc
storage:
  files:
    - path: /etc/app.conf
      contents: {inline: x}
      user: {name: www-data}
      group: {name: www-data}
`, []string{
			`storage.files[0].user.name: user "www-data" is neither in the image nor in passwd.users`,
			`storage.files[0].group.name: group "www-data" is neither in the image nor in passwd.groups`,
			`passwd.users[0].groups[1]: group "docker" is neither in the image nor in passwd.groups`,
			"passwd.users[1].homeDir: home directory /srv/svc is on the image's read-only root",
		}},
		{"units the image lacks", `systemd:
  units:
    - name: podman-auto-update.timer
      enabled: true
    - name: docker.service
      dropins:
        - name: 10-opts.conf
          contents: "[Service]\n"
    - name: zincati.service
      enabled: false
`, []string{
			"systemd.units[0].enabled: podman-auto-update.timer is not a unit the image ships and the config gives it no contents",
			"systemd.units[1].dropins: drop-ins for docker.service, which is not a unit the image ships and the config gives no contents",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte("variant: fcos\nversion: 1.7.0\n" + tc.bu))
			if err != nil {
				t.Fatal(err)
			}
			err = c.CheckImage(&testImage)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("CheckImage: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("CheckImage passed; want %d findings", len(tc.want))
			}
			got := strings.Split(err.Error(), "\n")
			if len(got) != len(tc.want) {
				t.Fatalf("findings:\n%s\nwant %d:\n%s", err, len(tc.want), strings.Join(tc.want, "\n"))
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(got[i], w) {
					t.Errorf("finding %d: %s\nwant %s", i, got[i], w)
				}
			}
		})
	}
}

// An image whose metadata records no programs (baked before kiln recorded them) has every
// program a config names: nothing is refused for want of one.
func TestCheckImageWithoutPrograms(t *testing.T) {
	img := testImage
	img.ProgramDirs, img.Programs, img.Links = nil, nil, nil
	c, err := Parse([]byte("variant: fcos\nversion: 1.7.0\nsystemd:\n  units:\n    - name: a.service\n      contents: \"[Service]\\nExecStart=/bin/podman run x\\n\"\nstorage:\n  files:\n    - path: /etc/NetworkManager/conf.d/a.conf\n"))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.CheckImage(&img); err != nil {
		t.Errorf("CheckImage: %v", err)
	}
}

// The programs a unit runs, as systemd finds them: after the prefixes, quoted or not, across
// continuation lines; not those given by name only or through specifiers and variables.
func TestExecPrograms(t *testing.T) {
	unit := "[Unit]\nDescription=ExecStart=/not/this\n# ExecStart=/usr/bin/commented\n[Service]\n" +
		"ExecStart=\n" +
		"ExecStartPre=-/bin/podman kill x\n" +
		"ExecStartPre=!!/usr/sbin/setcap x\n" +
		"ExecStart=\"/opt/my app/run\" --flag\n" +
		"ExecStartPost=/usr/bin/long \\\n  --arg\n" +
		"ExecReload = /usr/bin/kill -HUP $MAINPID\n" +
		"ExecStop=podman stop x\n" +
		"ExecStopPost=%h/bin/clean\n" +
		"ExecCondition=${TOOL} check\n" +
		"Environment=ExecStart=/usr/bin/env\n"
	got := execPrograms(unit)
	want := []execLine{{6, "ExecStartPre", "/bin/podman"}, {7, "ExecStartPre", "/usr/sbin/setcap"}, {8, "ExecStart", "/opt/my app/run"},
		{9, "ExecStartPost", "/usr/bin/long"}, {11, "ExecReload", "/usr/bin/kill"}}
	if !slices.Equal(got, want) {
		t.Errorf("execPrograms:\n%v\nwant\n%v", got, want)
	}
}

// A config that gives a user ssh keys gets the image's ssh server enabled, unless it says
// something about the unit itself or the image does not ship it.
func TestEnableSSHForKeys(t *testing.T) {
	keys := "passwd:\n  users:\n    - name: core\n      ssh_authorized_keys: [\"" + edKey + "\"]\n"
	for _, tc := range []struct {
		name, bu string
		shipped  bool
		want     bool  // enabled by EnableSSHForKeys
		enabled  *bool // ssh.service's enabled afterwards; nil: no entry
	}{
		{"keys", keys, true, true, ptr(true)},
		{"keys, image without ssh", keys, false, false, nil},
		{"no keys", "passwd:\n  users:\n    - name: core\n", true, false, nil},
		{"keys, ssh disabled by the config", keys + "systemd:\n  units:\n    - name: ssh.service\n      enabled: false\n", true, false, ptr(false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse([]byte("variant: fcos\nversion: 1.7.0\n" + tc.bu))
			if err != nil {
				t.Fatal(err)
			}
			if got := c.EnableSSHForKeys(tc.shipped); got != tc.want {
				t.Errorf("EnableSSHForKeys = %v, want %v", got, tc.want)
			}
			var enabled *bool
			n := 0
			for _, u := range c.Ignition.Systemd.Units {
				if u.Name == SSHUnit {
					enabled, n = u.Enabled, n+1
				}
			}
			if n > 1 || (enabled == nil) != (tc.enabled == nil) || (enabled != nil && *enabled != *tc.enabled) {
				t.Errorf("%d ssh.service entries, enabled %v; want %v", n, enabled, tc.enabled)
			}
			if err := c.Validate(); err != nil {
				t.Errorf("the config no longer validates: %v", err)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }
