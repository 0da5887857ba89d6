package source

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

const ign = `{"ignition":{"version":"3.4.0"}}`

// fakeSysfs builds <dir>/firmware/qemu_fw_cfg (and the kiln item when item != nil).
func fakeSysfs(t *testing.T, withDevice bool, item []byte) string {
	t.Helper()
	sys := t.TempDir()
	if withDevice {
		makeDevice(t, sys, item)
	}
	return sys
}

func makeDevice(t *testing.T, sys string, item []byte) {
	t.Helper()
	dev := filepath.Join(sys, "firmware", "qemu_fw_cfg", "by_name", "etc", "boot-menu-wait")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	if item == nil {
		return
	}
	dir := filepath.Join(sys, "firmware", "qemu_fw_cfg", "by_name", "opt", "dev.kiln", "config")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"raw": item, "name": []byte(nodeimage.FWCfgName), "size": []byte("33")} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o400); err != nil {
			t.Fatal(err)
		}
	}
}

func TestFWCfg(t *testing.T) {
	tests := []struct {
		name       string
		device     bool
		item       []byte
		load       func(t *testing.T, sys string) error // nil: loading fails
		wantProbe  bool
		wantLoads  int
		wantConfig string
	}{
		{name: "device with kiln item", device: true, item: []byte(ign), wantProbe: true, wantConfig: ign},
		{name: "device without kiln item", device: true, wantProbe: false},
		{name: "module loads and item appears", item: []byte(ign),
			load:      func(t *testing.T, sys string) error { makeDevice(t, sys, []byte(ign)); return nil },
			wantProbe: true, wantLoads: 1, wantConfig: ign},
		{name: "not a QEMU machine", wantProbe: false, wantLoads: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			sys := fakeSysfs(t, tc.device, tc.item)
			loads := 0
			p := &FWCfg{Sysfs: sys, LoadModule: func(context.Context) error {
				loads++
				if tc.load == nil {
					return errors.New("modprobe: FATAL: Module qemu_fw_cfg not found")
				}
				return tc.load(t, sys)
			}}
			ctx := context.Background()
			if got := p.Probe(ctx); got != tc.wantProbe {
				t.Fatalf("Probe = %v, want %v", got, tc.wantProbe)
			}
			// A second probe never retries the module.
			p.Probe(ctx)
			if loads != tc.wantLoads {
				t.Errorf("module loaded %d times, want %d", loads, tc.wantLoads)
			}
			if !tc.wantProbe {
				return
			}
			got, err := p.Fetch(ctx)
			if err != nil {
				t.Fatalf("Fetch: %v", err)
			}
			if string(got) != tc.wantConfig {
				t.Errorf("Fetch = %q, want %q", got, tc.wantConfig)
			}
		})
	}
}

func TestFWCfgRawPath(t *testing.T) {
	p := &FWCfg{}
	if got, want := p.RawPath(), "/sys/firmware/qemu_fw_cfg/by_name/opt/dev.kiln/config/raw"; got != want {
		t.Errorf("RawPath = %s, want %s", got, want)
	}
}

func TestEmbedded(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "config.ign")
	if err := os.WriteFile(present, []byte(ign), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		path string
		want bool
	}{
		{"present", present, true},
		{"absent", filepath.Join(dir, "missing.ign"), false},
		{"directory", dir, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := Embedded{Path: tc.path}
			if got := e.Probe(context.Background()); got != tc.want {
				t.Fatalf("Probe = %v, want %v", got, tc.want)
			}
			if !tc.want {
				return
			}
			data, err := e.Fetch(context.Background())
			if err != nil || string(data) != ign {
				t.Errorf("Fetch = %q, %v", data, err)
			}
		})
	}
}

// stub is a provider with scripted answers, for Select's ordering and timeouts.
type stub struct {
	name    string
	present bool
	data    string
	err     error
	hang    <-chan struct{} // Fetch (or Probe when !present) blocks until it is closed, ignoring ctx
	fetched *bool
}

func (s stub) Name() string { return s.name }
func (s stub) Probe(context.Context) bool {
	if !s.present && s.hang != nil {
		<-s.hang
	}
	return s.present
}
func (s stub) Fetch(context.Context) ([]byte, error) {
	if s.fetched != nil {
		*s.fetched = true
	}
	if s.hang != nil {
		<-s.hang
	}
	return []byte(s.data), s.err
}

func TestSelect(t *testing.T) {
	hung := make(chan struct{})
	t.Cleanup(func() { close(hung) })
	dir := t.TempDir()
	embedded := filepath.Join(dir, "config.ign")
	if err := os.WriteFile(embedded, []byte(ign), 0o644); err != nil {
		t.Fatal(err)
	}
	noQEMU := &FWCfg{Sysfs: dir, LoadModule: func(context.Context) error { return errors.New("no such module") }}
	var laterFetched bool

	tests := []struct {
		name      string
		providers []Provider
		wantData  string
		wantSrc   string
		wantErr   string
	}{
		{name: "no providers"},
		{name: "nothing anywhere", providers: []Provider{noQEMU, Embedded{Path: filepath.Join(dir, "none")}}},
		{name: "falls through absent fw_cfg to embedded", providers: []Provider{noQEMU, Embedded{Path: embedded}},
			wantData: ign, wantSrc: "embedded"},
		{name: "first present source wins", providers: []Provider{
			stub{name: "a", present: true, data: "A"},
			stub{name: "b", present: true, data: "B", fetched: &laterFetched},
		}, wantData: "A", wantSrc: "a"},
		{name: "empty answer falls through", providers: []Provider{
			stub{name: "a", present: true},
			stub{name: "b", present: true, data: "B"},
		}, wantData: "B", wantSrc: "b"},
		{name: "garbage is returned, not skipped", providers: []Provider{
			stub{name: "a", present: true, data: "}{not json"},
			stub{name: "b", present: true, data: "B"},
		}, wantData: "}{not json", wantSrc: "a"},
		{name: "fetch error stops the search", providers: []Provider{
			stub{name: "a", present: true, err: errors.New("input/output error")},
			stub{name: "b", present: true, data: "B"},
		}, wantErr: "config source a: input/output error"},
		{name: "hung fetch times out", providers: []Provider{
			stub{name: "a", present: true, data: "A", hang: hung},
			stub{name: "b", present: true, data: "B"},
		}, wantErr: "config source a: fetch: context deadline exceeded"},
		{name: "hung probe is skipped", providers: []Provider{
			stub{name: "a", hang: hung},
			stub{name: "b", present: true, data: "B"},
		}, wantData: "B", wantSrc: "b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// A hung provider blocks until the test ends: Select returns only if it gives up
			// on it after the per-source timeout.
			data, src, err := Select(context.Background(), tc.providers, time.Second)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Select: %v", err)
			}
			if string(data) != tc.wantData || src != tc.wantSrc {
				t.Errorf("Select = %q from %q, want %q from %q", data, src, tc.wantData, tc.wantSrc)
			}
		})
	}
	if laterFetched {
		t.Error("a later source was fetched although an earlier one had a config")
	}
}
