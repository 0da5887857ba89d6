package install

import (
	"context"
	"crypto/sha512"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"

	"github.com/kilnproject/kiln/internal/testkit"
)

// fakeDisk is a disk in a fake sysfs tree, its device node a sparse file.
type fakeDisk struct {
	name, serial string
	size         int64
	removable    bool
	ext4         bool // holds an ext4 filesystem
}

// fakeHost makes /sys/block and /dev for disks, as the kernel shows them to stage 1 (no udev).
func fakeHost(t *testing.T, disks ...fakeDisk) host {
	t.Helper()
	root := t.TempDir()
	h := host{sysBlock: filepath.Join(root, "sys/block"), devDir: filepath.Join(root, "dev")}
	for _, d := range disks {
		dir := filepath.Join(h.sysBlock, d.name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		rm := "0"
		if d.removable {
			rm = "1"
		}
		for f, v := range map[string]string{"size": strconv.FormatInt(d.size/512, 10), "removable": rm, "ro": "0", "serial": d.serial} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(h.devDir, 0o755); err != nil {
			t.Fatal(err)
		}
		dev := filepath.Join(h.devDir, d.name)
		f, err := os.Create(dev)
		if err != nil {
			t.Fatal(err)
		}
		f.Truncate(d.size)
		f.Close()
		if d.ext4 {
			testkit.Run(t, testkit.Tool(t, "mkfs.ext4", "e2fsprogs"), "-q", "-F", dev)
		}
	}
	return h
}

// TestAuto: kiln.install.dev=auto takes the only empty disk it may use, never the etcd volume
// the node config names, and otherwise refuses with every disk it saw and why it passed it over.
func TestAuto(t *testing.T) {
	img := makeImage(t)
	srv := newServer(t)
	// As the zstd program does, the frame header declares the image's size.
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	srv.files["/img.raw.zst"] = enc.EncodeAll(img.raw, nil)
	srv.files["/etcd-main.ign"] = nodeConfigIgn("etcd-main")
	srv.files["/etcd-gone.ign"] = nodeConfigIgn("etcd-gone")
	// A pointer config: the node config is in the config it merges, as first boot renders it.
	sum := sha512.Sum512(srv.files["/etcd-main.ign"])
	srv.files["/pointer.ign"] = []byte(`{"ignition":{"version":"3.4.0","config":{"merge":[{"source":"` + srv.URL + `/etcd-main.ign",` +
		`"verification":{"hash":"sha512-` + hex.EncodeToString(sum[:]) + `"}}]}}}`)
	empty := func(name, serial string) fakeDisk { return fakeDisk{name: name, serial: serial, size: 64 * mib} }
	tests := []struct {
		name    string
		disks   []fakeDisk
		config  string // the config URL's file, "" for none
		dev     string
		wipe    bool
		want    string // the disk installed to
		wantErr []string
		wantLog []string // what the console says, besides
	}{
		{name: "one empty disk beside the etcd volume", disks: []fakeDisk{empty("vda", "etcd-main"), empty("vdb", "os"), {name: "vdc", serial: "old", size: 64 * mib, ext4: true}},
			config: "etcd-main.ign", dev: auto, want: "vdb",
			wantLog: []string{`msg="install: skipped the etcd volume" disk="DEV/vda (64 MiB, serial etcd-main)" selector="etcd.volume.serial=etcd-main"`,
				`msg="install: skipped" disk="DEV/vdc (64 MiB, serial old)" why="holds ext4"`}},
		{name: "one empty disk beside the etcd volume of a merged config", disks: []fakeDisk{empty("vda", "etcd-main"), empty("vdb", "os")},
			config: "pointer.ign", dev: auto, want: "vdb", wantLog: []string{`msg="install: skipped the etcd volume" disk="DEV/vda (64 MiB, serial etcd-main)"`}},
		{name: "two empty disks", disks: []fakeDisk{empty("vda", "one"), empty("vdb", "two")}, dev: auto,
			wantErr: []string{"2 empty disks", "vda (64 MiB, serial one): empty", "vdb (64 MiB, serial two): empty", "by-id virtio-two"}},
		{name: "two empty disks without a config to tell the etcd one", disks: []fakeDisk{empty("vda", "etcd-main"), empty("vdb", "os")}, dev: auto,
			wantErr: []string{"2 empty disks"}},
		{name: "etcd volume not among the disks", disks: []fakeDisk{empty("vda", "os")}, config: "etcd-gone.ign", dev: auto,
			wantErr: []string{"etcd.volume.serial=etcd-gone selects none of the disks seen", "vda (64 MiB, serial os)"}},
		{name: "none usable", dev: auto, config: "etcd-main.ign", disks: []fakeDisk{
			{name: "vda", serial: "old", size: 64 * mib, ext4: true}, empty("vdb", "etcd-main"), {name: "sda", size: 64 * mib, removable: true},
			empty("sr0", ""), empty("loop0", ""), {name: "vdc", serial: "tiny", size: 8 * mib}},
			wantErr: []string{"no empty disk", "vda (64 MiB, serial old): holds ext4", "vdb (64 MiB, serial etcd-main): empty; excluded: etcd volume (etcd.volume.serial=etcd-main)",
				"sda (64 MiB): empty; excluded: removable", "sr0 (64 MiB): empty; excluded: not a disk", "loop0 (64 MiB): empty; excluded: not a disk",
				"vdc (8 MiB, serial tiny): empty; excluded: smaller than the image (56 MiB)", "without kiln.install.wipe=1"}},
		{name: "wipe takes the only usable disk", disks: []fakeDisk{{name: "vda", serial: "old", size: 64 * mib, ext4: true}, empty("vdb", "etcd-main")},
			config: "etcd-main.ign", dev: auto, wipe: true, want: "vda"},
		{name: "by-id name", disks: []fakeDisk{empty("vda", "etcd-main"), empty("vdb", "os")}, dev: "virtio-os", want: "vdb"},
		{name: "named disk beside the etcd volume", disks: []fakeDisk{empty("vda", "etcd-main"), empty("vdb", "os")}, config: "etcd-main.ign",
			dev: "virtio-os", want: "vdb", wantLog: []string{`msg="install: skipped the etcd volume" disk="DEV/vda (64 MiB, serial etcd-main)"`}},
		{name: "wipe of a named disk while the etcd volume is not seen", disks: []fakeDisk{{name: "vda", serial: "old", size: 64 * mib, ext4: true}},
			config: "etcd-gone.ign", dev: "virtio-old", wipe: true,
			wantErr: []string{"kiln.install.dev=virtio-old with kiln.install.wipe=1: ", "vda (64 MiB, serial old) holds ext4, and the node config's etcd.volume.serial=etcd-gone selects none of the disks seen, so the installer cannot keep clear of it"}},
		{name: "wipe of a named empty disk while the etcd volume is not seen", disks: []fakeDisk{empty("vda", "os")},
			config: "etcd-gone.ign", dev: "virtio-os", wipe: true, want: "vda",
			wantLog: []string{`level=WARN msg="install: the node config's etcd.volume.serial=etcd-gone selects none of the disks seen; kiln.install.dev=virtio-os: it is empty, so it holds no etcd data either way"`}},
		{name: "named empty disk while the etcd volume is not seen", disks: []fakeDisk{empty("vda", "os")}, config: "etcd-gone.ign",
			dev: "virtio-os", want: "vda",
			wantLog: []string{`level=WARN msg="install: the node config's etcd.volume.serial=etcd-gone selects none of the disks seen; kiln.install.dev=virtio-os: it is empty`}},
		{name: "by-id name of the etcd volume", disks: []fakeDisk{empty("vda", "etcd-main"), empty("vdb", "os")}, config: "etcd-main.ign",
			dev: "virtio-etcd-main", wantErr: []string{"is the etcd volume (etcd.volume.serial=etcd-main)"}},
		{name: "unknown by-id name", disks: []fakeDisk{empty("vda", "os")}, dev: "virtio-nope",
			wantErr: []string{"kiln.install.dev=virtio-nope: no disk has this /dev/disk/by-id name", "by-id virtio-os"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := testOpts(t)
			o.host = fakeHost(t, tt.disks...)
			p := params{dev: tt.dev, imageURL: srv.url(t, "img.raw.zst"), sha256: sha(srv.files["/img.raw.zst"]), wipe: tt.wipe}
			if tt.config != "" {
				p.configURL = srv.URL + "/" + tt.config
			}
			before := map[string]string{}
			for _, d := range tt.disks {
				before[d.name] = fileSHA(t, filepath.Join(o.host.devDir, d.name))
			}
			log, logs := logBuffer()
			res, err := install(context.Background(), log, p, o)
			if tt.wantErr != nil {
				if !errors.Is(err, errNoTarget) {
					t.Fatalf("Install error = %v, want a refusal", err)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error does not say %q:\n%v", w, err)
					}
				}
			} else if err != nil {
				t.Fatal(err)
			} else if res.device != filepath.Join(o.host.devDir, tt.want) {
				t.Errorf("installed to %s, want %s", res.device, tt.want)
			}
			for _, d := range tt.disks {
				if d.name != tt.want && fileSHA(t, filepath.Join(o.host.devDir, d.name)) != before[d.name] {
					t.Errorf("%s changed", d.name)
				}
			}
			for _, w := range tt.wantLog {
				if w = strings.ReplaceAll(w, "DEV/", o.host.devDir+"/"); !strings.Contains(logs.String(), w) {
					t.Errorf("the console does not say %s:\n%s", w, logs)
				}
			}
		})
	}
}

// TestAutoWaitsForDisks: the kernel probes disks while stage 1 runs; a disk that shows up
// within Options.DiskWait is found, and auto does not settle for less before then.
func TestAutoWaitsForDisks(t *testing.T) {
	img := makeImage(t)
	srv := newServer(t)
	srv.files["/img.raw"] = img.raw
	srv.files["/etcd-main.ign"] = nodeConfigIgn("etcd-main")
	o := testOpts(t)
	o.DiskWait = 10 * time.Second
	o.host = fakeHost(t, fakeDisk{name: "vdb", serial: "os", size: 64 * mib})
	// The etcd volume appears late: until then auto cannot tell which disk it is.
	late := fakeHost(t, fakeDisk{name: "vda", serial: "etcd-main", size: 64 * mib})
	go func() {
		time.Sleep(300 * time.Millisecond)
		os.Rename(filepath.Join(late.devDir, "vda"), filepath.Join(o.host.devDir, "vda"))
		os.Rename(filepath.Join(late.sysBlock, "vda"), filepath.Join(o.host.sysBlock, "vda"))
	}()
	start := time.Now()
	p := params{dev: auto, imageURL: srv.url(t, "img.raw"), sha256: sha(img.raw), configURL: srv.URL + "/etcd-main.ign"}
	res, err := install(context.Background(), slog.New(slog.DiscardHandler), p, o)
	if err != nil {
		t.Fatal(err)
	}
	if res.device != filepath.Join(o.host.devDir, "vdb") || time.Since(start) < 300*time.Millisecond {
		t.Errorf("installed to %s after %s", res.device, time.Since(start))
	}
}
