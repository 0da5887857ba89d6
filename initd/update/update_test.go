package update

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/nodeimage"
	"github.com/kilnproject/kiln/internal/verity"
)

const (
	guidA = "11111111-1111-4111-8111-111111111111"
	guidB = "22222222-2222-4222-8222-222222222222"
)

// node is a disk in files: an ESP directory as the bake writes it (slot a's entry, kernel,
// initramfs) and two slot files, a holding the running root.
type node struct {
	disk Disk
	root string // the node's /, for the update's record
}

func newNode(t *testing.T) node {
	t.Helper()
	dir := t.TempDir()
	esp := filepath.Join(dir, "esp")
	for p, text := range map[string]string{
		nodeimage.LoaderConfPath:   "default kiln-a.conf\ntimeout 0\n",
		nodeimage.LoaderEntryPath:  "title kiln\nlinux /kiln/a/vmlinuz\ninitrd /kiln/a/initrd.img\noptions root=PARTUUID=" + guidA + " rootfstype=squashfs ro kiln.verity.roothash=" + strings.Repeat("aa", 32) + " kiln.verity.hashoffset=4096\n",
		nodeimage.KernelPath:       "old kernel",
		nodeimage.InitrdPath:       "old initrd",
		nodeimage.ESPImageJSONPath: `{"name":"qemu","role":"worker","kiln":"v1"}`,
	} {
		writeFile(t, espPath(esp, p), text)
	}
	slots := map[string]Slot{}
	for l, g := range map[string]string{"a": guidA, "b": guidB} {
		p := filepath.Join(dir, "root-"+l)
		writeFile(t, p, strings.Repeat(l, 1<<20))
		slots[l] = Slot{Letter: l, Name: "root-" + l, Device: p, PARTUUID: g, Size: 1 << 20}
	}
	return node{disk: Disk{ESPDir: esp, Slots: slots, Booted: "a"}, root: filepath.Join(dir, "sysroot")}
}

func writeFile(t *testing.T, p, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

// newImage writes a bake's output as an update reads it: <dir>/qemu-worker.json and the pxe
// directory with a kernel, an initramfs and a root image carrying a verity tree.
func newImage(t *testing.T, created time.Time) (string, *nodeimage.Metadata) {
	t.Helper()
	dir := t.TempDir()
	pxe := filepath.Join(dir, "qemu-worker-pxe")
	root := filepath.Join(pxe, "rootfs.img")
	data := make([]byte, 600<<10)
	rand.Read(data)
	writeFile(t, root, string(data))
	p, err := verity.Append(root, []byte("salt"))
	if err != nil {
		t.Fatal(err)
	}
	file := func(name, content string) nodeimage.PXEFile {
		if content != "" {
			writeFile(t, filepath.Join(pxe, name), content)
		}
		b, _ := os.ReadFile(filepath.Join(pxe, name))
		sum := sha256.Sum256(b)
		return nodeimage.PXEFile{File: name, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(b))}
	}
	md := &nodeimage.Metadata{Name: "qemu", Role: "worker", Platform: "qemu", Created: created, Kiln: "v2", Contract: nodeimage.ContractVersion,
		Kernel: nodeimage.KernelInfo{Version: "6.1.0-test"},
		Verity: &nodeimage.VerityInfo{RootHash: p.RootHashHex(), Salt: hex.EncodeToString(p.Salt), Algorithm: verity.Algorithm,
			DataBlocks: p.DataBlocks, HashOffset: p.HashOffset, Size: p.End()},
		Disk: &nodeimage.DiskInfo{Cmdline: "root=PARTUUID=99999999-9999-4999-8999-999999999999 rootfstype=squashfs ro kiln.platform=qemu console=ttyS0 kiln.verity.roothash=" + p.RootHashHex() + " kiln.verity.hashoffset=" + itoa(p.HashOffset)},
		PXE: &nodeimage.PXEInfo{Dir: "qemu-worker-pxe", Kernel: file("vmlinuz", "new kernel"), Initrd: file("initrd.img", "new initrd"),
			RootFS: file("rootfs.img", "")},
	}
	b, _ := json.Marshal(md)
	mdPath := filepath.Join(dir, "qemu-worker.json")
	writeFile(t, mdPath, string(b))
	return mdPath, md
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func running(created time.Time) Running {
	return Running{Image: &nodeimage.Metadata{Name: "qemu", Role: "worker", Platform: "qemu", Created: created}, RootHash: strings.Repeat("aa", 32)}
}

var quiet = slog.New(slog.DiscardHandler)

// defaultEntry is the entry systemd-boot would boot next.
func defaultEntry(t *testing.T, esp string) Entry {
	t.Helper()
	entries, err := readEntries(esp)
	if err != nil {
		t.Fatal(err)
	}
	e, ok := Default(entries)
	if !ok {
		t.Fatal("no boot entry left")
	}
	return e
}

func TestApply(t *testing.T) {
	n := newNode(t)
	mdPath, md := newImage(t, time.Unix(2000, 0))
	src, err := NewSource(mdPath, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := Check(md, running(time.Unix(1000, 0)), n.disk.Other(), Options{}); err != nil {
		t.Fatal(err)
	}
	res, err := Apply(t.Context(), quiet, src, md, n.disk, n.root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Entry != "kiln-b+3.conf" || res.Slot.Letter != "b" || res.Generation != 1 {
		t.Errorf("result %+v", res)
	}
	// Slot b holds the root image, slot a is untouched.
	want, _ := os.ReadFile(filepath.Join(filepath.Dir(mdPath), "qemu-worker-pxe", "rootfs.img"))
	got, _ := os.ReadFile(n.disk.Slots["b"].Device)
	if !bytes.Equal(got[:len(want)], want) {
		t.Error("slot b does not hold the root image")
	}
	if a, _ := os.ReadFile(n.disk.Slots["a"].Device); string(a) != strings.Repeat("a", 1<<20) {
		t.Error("the running slot was written")
	}
	for p, want := range map[string]string{"/kiln/b/vmlinuz": "new kernel", "/kiln/b/initrd.img": "new initrd", nodeimage.KernelPath: "old kernel", nodeimage.LoaderConfPath: loaderConf} {
		if b, _ := os.ReadFile(espPath(n.disk.ESPDir, p)); string(b) != want {
			t.Errorf("ESP %s = %q, want %q", p, b, want)
		}
	}
	def := defaultEntry(t, n.disk.ESPDir)
	if def.File != "kiln-b+3.conf" || !def.Counting || def.TriesLeft != 3 || def.RootHash() != md.Verity.RootHash ||
		!strings.Contains(def.Options, "root=PARTUUID="+guidB+" ") || !strings.HasSuffix(def.Options, " panic=10") {
		t.Errorf("default entry %+v", def)
	}
	st, err := ReadState(n.root)
	if err != nil || st.Slot != "b" || st.From != "a" || st.RootHash != md.Verity.RootHash || st.Entry != "kiln-b+3.conf" {
		t.Errorf("state %+v, %v", st, err)
	}
	status, err := Read(n.disk, n.root)
	if err != nil || status.Slots[1].Image != "qemu-worker" || status.Slots[1].Kiln != "v2" || !status.Slots[1].Default || !status.Slots[0].Booted {
		t.Errorf("status %+v, %v", status, err)
	}
}

func TestCheckRefuses(t *testing.T) {
	n := newNode(t)
	_, md := newImage(t, time.Unix(2000, 0))
	cases := []struct {
		name   string
		change func(md *nodeimage.Metadata, run *Running, slot *Slot)
		o      Options
		want   string
	}{
		{"another role", func(md *nodeimage.Metadata, _ *Running, _ *Slot) { md.Role = "control-plane" }, Options{}, "is a control-plane image; this node is a worker"},
		{"another platform", func(md *nodeimage.Metadata, _ *Running, _ *Slot) { md.Platform = "aws" }, Options{}, "is for platform aws; this node runs qemu"},
		{"unknown contract", func(md *nodeimage.Metadata, _ *Running, _ *Slot) { md.Contract = 2 }, Options{}, "follows bake↔boot contract 2; this kiln-init knows contract 1"},
		{"no pxe files", func(md *nodeimage.Metadata, _ *Running, _ *Slot) { md.PXE = nil }, Options{}, "baked without the pxe format"},
		{"older", func(_ *nodeimage.Metadata, run *Running, _ *Slot) { run.Image.Created = time.Unix(3000, 0) }, Options{}, "refusing a downgrade without --allow-downgrade"},
		{"slot too small", func(_ *nodeimage.Metadata, _ *Running, s *Slot) { s.Size = 4096 }, Options{}, "slot root-b"},
		{"already running", func(md *nodeimage.Metadata, run *Running, _ *Slot) { run.RootHash = md.Verity.RootHash }, Options{}, "already runs this image"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := *md
			run := running(time.Unix(1000, 0))
			slot := n.disk.Other()
			tc.change(&m, &run, &slot)
			err := Check(&m, run, slot, tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Check = %v, want %q", err, tc.want)
			}
		})
	}
	run := running(time.Unix(3000, 0))
	if err := Check(md, run, n.disk.Other(), Options{AllowDowngrade: true}); err != nil {
		t.Errorf("--allow-downgrade: %v", err)
	}
}

// cutSource is a source whose files end early: a download cut, or a power cut while writing.
type cutSource struct {
	Source
	name string
	at   int64
}

func (c cutSource) Open(ctx context.Context, name string) (io.ReadCloser, error) {
	r, err := c.Source.Open(ctx, name)
	if err != nil || !strings.HasSuffix(name, c.name) {
		return r, err
	}
	return struct {
		io.Reader
		io.Closer
	}{io.MultiReader(io.LimitReader(r, c.at), errReader{}), r}, nil
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("connection reset") }

// An update that stops at any point (the source cut while the root, the kernel or the
// initramfs is written, a root image whose bytes do not match) leaves the running slot
// booting, with no entry for the slot being written; the next update succeeds.
func TestApplyStopped(t *testing.T) {
	mdPath, md := newImage(t, time.Unix(2000, 0))
	good, _ := NewSource(mdPath, nil)
	cases := []struct {
		name string
		src  Source
		md   func() *nodeimage.Metadata
		want string
	}{
		{"cut in the root image", cutSource{good, "rootfs.img", 300 << 10}, nil, "connection reset"},
		{"cut in the kernel", cutSource{good, "vmlinuz", 3}, nil, "connection reset"},
		{"cut in the initramfs", cutSource{good, "initrd.img", 0}, nil, "connection reset"},
		{"root image of other bytes", good, func() *nodeimage.Metadata {
			m := *md
			r := *m.PXE
			r.RootFS.SHA256 = strings.Repeat("0", 64)
			m.PXE = &r
			return &m
		}, "refusing it"},
		{"verity tree that does not match", good, func() *nodeimage.Metadata {
			m := *md
			v := *m.Verity
			v.RootHash = strings.Repeat("0", 64)
			m.Verity = &v
			return &m
		}, "does not match the verity tree"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			m := md
			if tc.md != nil {
				m = tc.md()
			}
			_, err := Apply(t.Context(), quiet, tc.src, m, n.disk, n.root, Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Apply = %v, want %q", err, tc.want)
			}
			if def := defaultEntry(t, n.disk.ESPDir); def.Slot != "a" {
				t.Fatalf("after a stopped update the default entry is %s", def.File)
			}
			entries, _ := readEntries(n.disk.ESPDir)
			if len(entries) != 1 {
				t.Errorf("entries %+v, want slot a's alone", entries)
			}
			if _, err := Apply(t.Context(), quiet, good, md, n.disk, n.root, Options{}); err != nil {
				t.Fatalf("the next update: %v", err)
			}
			if def := defaultEntry(t, n.disk.ESPDir); def.File != "kiln-b+3.conf" {
				t.Errorf("after the next update the default is %s", def.File)
			}
		})
	}
}

// The order systemd-boot 252 gives kiln's entries decides what boots: a new slot on trial
// first, the bake's entry (no sort key) after entries with one, an entry out of tries last.
func TestDefault(t *testing.T) {
	cases := []struct {
		name    string
		entries []Entry
		want    string
	}{
		{"the bake's entry alone", []Entry{{File: "kiln-a.conf", Slot: "a"}}, "kiln-a.conf"},
		{"an update on trial before the bake's entry", []Entry{{File: "kiln-a.conf", Slot: "a"}, {File: "kiln-b+3.conf", Slot: "b", Counting: true, TriesLeft: 3, SortKey: "kiln", Version: "1"}}, "kiln-b+3.conf"},
		{"tried twice, one left", []Entry{{File: "kiln-a.conf", Slot: "a"}, {File: "kiln-b+1-2.conf", Slot: "b", Counting: true, TriesLeft: 1, TriesDone: 2, SortKey: "kiln", Version: "1"}}, "kiln-b+1-2.conf"},
		{"out of tries: the old slot", []Entry{{File: "kiln-a.conf", Slot: "a"}, {File: "kiln-b+0-3.conf", Slot: "b", Counting: true, TriesDone: 3, SortKey: "kiln", Version: "1"}}, "kiln-a.conf"},
		{"the higher generation", []Entry{{File: "kiln-a.conf", Slot: "a", SortKey: "kiln", Version: "3"}, {File: "kiln-b.conf", Slot: "b", SortKey: "kiln", Version: "2"}}, "kiln-a.conf"},
		{"generations compare as numbers", []Entry{{File: "kiln-a.conf", Slot: "a", SortKey: "kiln", Version: "9"}, {File: "kiln-b.conf", Slot: "b", SortKey: "kiln", Version: "10"}}, "kiln-b.conf"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := Default(tc.entries); got.File != tc.want {
				t.Errorf("Default = %s, want %s", got.File, tc.want)
			}
		})
	}
}

func TestBootCheckAndRollBack(t *testing.T) {
	n := newNode(t)
	mdPath, md := newImage(t, time.Unix(2000, 0))
	src, _ := NewSource(mdPath, nil)
	if _, err := Apply(t.Context(), quiet, src, md, n.disk, n.root, Options{}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(n.disk.ESPDir, nodeimage.LoaderEntriesDir)
	now := func() time.Time { return time.Unix(5000, 0) }
	// The boot loader tried slot b once; its health fails within the bound.
	os.Rename(filepath.Join(dir, "kiln-b+3.conf"), filepath.Join(dir, "kiln-b+2-1.conf"))
	onB := n.disk
	onB.Booted = "b"
	// While b is on trial, slot a is the fallback: no update writes it.
	if _, err := Apply(t.Context(), quiet, src, md, onB, n.root, Options{}); err == nil || !strings.Contains(err.Error(), "the booted slot b is on trial (kiln-b+2-1.conf)") {
		t.Fatalf("Apply while on trial = %v", err)
	}
	sick := func(context.Context) error { return errors.New("kubelet.service is failed") }
	out, err := BootCheck(t.Context(), quiet, onB, n.root, sick, 10*time.Millisecond, now)
	if err == nil || !out.Trial || out.Blessed {
		t.Fatalf("BootCheck of a sick slot = %+v, %v", out, err)
	}
	if st, _ := ReadState(n.root); st.LastFailure != "kubelet.service is failed" {
		t.Errorf("last failure %q", st.LastFailure)
	}
	// Tries used up: the boot loader boots slot a, and BootCheck there reports the rollback.
	os.Rename(filepath.Join(dir, "kiln-b+2-1.conf"), filepath.Join(dir, "kiln-b+0-3.conf"))
	if def := defaultEntry(t, n.disk.ESPDir); def.Slot != "a" {
		t.Fatalf("slot b out of tries, default %s", def.File)
	}
	out, err = BootCheck(t.Context(), quiet, n.disk, n.root, sick, time.Millisecond, now)
	if err != nil || out.RolledBack == nil || !strings.Contains(out.RolledBack.Reason, "slot b (qemu-worker) failed its 3 tries: kubelet.service is failed") {
		t.Fatalf("BootCheck after the tries = %+v, %v", out, err)
	}
	if _, err := RollBack(n.disk, n.root, "test", now); err == nil || !strings.Contains(err.Error(), "ran out of tries") {
		t.Errorf("RollBack to a failed slot = %v", err)
	}

	// A second update of slot b comes up healthy: blessed, and the default from then on.
	if _, err := Apply(t.Context(), quiet, src, md, n.disk, n.root, Options{}); err != nil {
		t.Fatal(err)
	}
	os.Rename(filepath.Join(dir, "kiln-b+3.conf"), filepath.Join(dir, "kiln-b+2-1.conf"))
	out, err = BootCheck(t.Context(), quiet, onB, n.root, func(context.Context) error { return nil }, time.Second, now)
	if err != nil || !out.Blessed || out.Entry != "kiln-b.conf" {
		t.Fatalf("BootCheck of a healthy slot = %+v, %v", out, err)
	}
	if def := defaultEntry(t, n.disk.ESPDir); def.File != "kiln-b.conf" || def.Counting {
		t.Errorf("default after blessing %+v", def)
	}
	if st, _ := ReadState(n.root); st.Blessed.IsZero() {
		t.Error("the record does not say the slot was found good")
	}
	// Rolling back from b makes the bake's slot a the default again.
	entry, err := RollBack(onB, n.root, "operator", now)
	if err != nil || entry != "kiln-a.conf" {
		t.Fatalf("RollBack = %s, %v", entry, err)
	}
	if def := defaultEntry(t, n.disk.ESPDir); def.File != "kiln-a.conf" || def.Generation() != 3 {
		t.Errorf("default after rollback %+v", def)
	}
}
