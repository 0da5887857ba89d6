package kube

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestEnsureResolvConf(t *testing.T) {
	lease := "# This is private data. Do not parse.\nADDRESS=10.0.2.15\nDNS=10.0.2.3 fd00::3\nROUTER=10.0.2.2\n"
	for _, tc := range []struct {
		name    string
		current string // "" = no file; "->" = a dangling link
		lease   string
		want    string // "" = left alone
	}{
		{name: "no file, no lease yet", want: resolvMarker},
		{name: "no file, DHCP answered", lease: lease, want: resolvMarker + "nameserver 10.0.2.3\nnameserver fd00::3\n"},
		{name: "kiln's empty file, DHCP answered since", current: resolvMarker, lease: lease, want: resolvMarker + "nameserver 10.0.2.3\nnameserver fd00::3\n"},
		{name: "the config's own file", current: "nameserver 192.0.2.53\n", lease: lease},
		{name: "a link to systemd-resolved's file", current: "->", lease: lease},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			p := filepath.Join(root, resolvConfPath)
			os.MkdirAll(filepath.Dir(p), 0o755)
			switch tc.current {
			case "":
			case "->":
				os.Symlink("/run/systemd/resolve/stub-resolv.conf", p)
			default:
				os.WriteFile(p, []byte(tc.current), 0o644)
			}
			if tc.lease != "" {
				mustWrite(t, filepath.Join(root, leasesPath, "2"), []byte(tc.lease), 0o644)
			}
			changed, err := EnsureResolvConf(root)
			if err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(p)
			if tc.want == "" {
				if changed || (tc.current != "->" && string(got) != tc.current) {
					t.Errorf("changed=%t, file %q; want it left alone", changed, got)
				}
				return
			}
			if !changed || string(got) != tc.want {
				t.Errorf("changed=%t, file:\n%s\nwant:\n%s", changed, got, tc.want)
			}
			if again, _ := EnsureResolvConf(root); again {
				t.Error("a second run changed it again")
			}
			if !strings.HasPrefix(string(got), "# Written by kiln-init") {
				t.Error("no marker")
			}
		})
	}
}

func TestNameservers(t *testing.T) {
	for _, tc := range []struct {
		name, resolv, lease string
		want                []string
	}{
		{"resolv.conf wins", "search example.com\nnameserver 10.0.0.2\nnameserver 10.0.0.3\n", "DNS=10.0.2.3\n", []string{"10.0.0.2", "10.0.0.3"}},
		{"a local stub is no upstream: the leases", "nameserver 127.0.0.53\n", "DNS=10.0.2.3 fd00::3\n", []string{"10.0.2.3", "fd00::3"}},
		{"offline: none", resolvMarker, "ADDRESS=10.0.2.15\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			os.MkdirAll(filepath.Join(root, "etc"), 0o755)
			os.MkdirAll(filepath.Join(root, leasesPath), 0o755)
			os.WriteFile(filepath.Join(root, resolvConfPath), []byte(tc.resolv), 0o644)
			os.WriteFile(filepath.Join(root, leasesPath, "2"), []byte(tc.lease), 0o644)
			if got := Nameservers(root); !slices.Equal(got, tc.want) {
				t.Errorf("Nameservers = %q, want %q", got, tc.want)
			}
		})
	}
}
