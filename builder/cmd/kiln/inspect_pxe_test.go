package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kilnproject/kiln/builder/output"
	"github.com/kilnproject/kiln/internal/nodeimage"
)

// pxeOutputs writes a pxe directory and the <image>-<role>.json recording it, as a bake does.
func pxeOutputs(t *testing.T) (out string, md nodeimage.Metadata) {
	t.Helper()
	out = t.TempDir()
	src := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(src, name)
		os.WriteFile(p, []byte(strings.Repeat(body, 100)), 0o644)
		return p
	}
	info, err := output.WritePXE(filepath.Join(out, "metal-worker-pxe"), output.PXESource{
		Kernel: file("k", "kernel"), Initrd: file("i", "initramfs"), RootFS: file("r", "squashfs"),
		KernelArgs: "ro kiln.platform=metal console=ttyS0", Title: "metal worker (6.1.0-test)"})
	if err != nil {
		t.Fatal(err)
	}
	md = nodeimage.Metadata{Name: "metal", Role: "worker", Platform: "metal", Kernel: nodeimage.KernelInfo{Version: "6.1.0-test"}, PXE: info}
	for _, f := range info.Files() {
		md.Outputs = append(md.Outputs, nodeimage.OutputInfo{Format: "pxe", File: info.Dir + "/" + f.File, Size: f.Size, SHA256: f.SHA256})
	}
	data, _ := json.Marshal(md)
	if err := os.WriteFile(filepath.Join(out, "metal-worker.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	return out, md
}

// kiln inspect on a pxe directory or the metadata beside it shows the network boot's kernel
// arguments and every file with its sha256, for people and as JSON.
func TestInspectPXE(t *testing.T) {
	out, md := pxeOutputs(t)
	for _, arg := range []string{filepath.Join(out, "metal-worker-pxe"), filepath.Join(out, "metal-worker-pxe") + "/", filepath.Join(out, "metal-worker.json")} {
		text, code := runKiln(t, "inspect", arg)
		if code != 0 {
			t.Fatalf("kiln inspect %s: exit %d\n%s", arg, code, text)
		}
		wants := []string{"kernel args: ro kiln.platform=metal console=ttyS0", "role worker, platform metal"}
		for _, f := range md.PXE.Files() {
			wants = append(wants, "metal-worker-pxe/"+f.File, f.SHA256)
		}
		for _, want := range wants {
			if !strings.Contains(text, want) {
				t.Errorf("kiln inspect %s lacks %q:\n%s", arg, want, text)
			}
		}
		if strings.Count(text, "  ok\n") != 4 {
			t.Errorf("kiln inspect %s: want 4 files checked ok:\n%s", arg, text)
		}
		js, code := runKiln(t, "inspect", arg, "-o", "json")
		var doc struct {
			PXE struct {
				OK         bool
				KernelArgs string
				Files      []output.PXECheck
			}
		}
		if code != 0 || json.Unmarshal([]byte(js), &doc) != nil {
			t.Fatalf("kiln inspect %s -o json: exit %d, not JSON:\n%s", arg, code, js)
		}
		if !doc.PXE.OK || len(doc.PXE.Files) != 4 || doc.PXE.Files[2].SHA256 != md.PXE.RootFS.SHA256 || doc.PXE.KernelArgs != md.PXE.KernelArgs {
			t.Errorf("kiln inspect %s -o json: %+v", arg, doc.PXE)
		}
	}
}

// A pxe directory whose files are not what the bake recorded is reported file by file, and
// inspect fails.
func TestInspectPXEMismatch(t *testing.T) {
	for _, tc := range []struct {
		name, file, want string
		change           func(p string)
	}{
		{"root image replaced", "rootfs.img", "rootfs.img has sha256", func(p string) {
			os.Remove(p)
			os.WriteFile(p, []byte(strings.Repeat("evil-fs!", 100)), 0o644)
		}},
		{"initramfs missing", "initrd.img", "initrd.img: open", func(p string) { os.Remove(p) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _ := pxeOutputs(t)
			dir := filepath.Join(out, "metal-worker-pxe")
			tc.change(filepath.Join(dir, tc.file))
			text, code := runKiln(t, "inspect", dir)
			if code != 1 || !strings.Contains(text, "MISMATCH: "+tc.want) || !strings.Contains(text, "does not match its metadata") {
				t.Errorf("kiln inspect: exit %d, want 1 naming %s:\n%s", code, tc.file, text)
			}
			if strings.Count(text, "  ok\n") != 3 {
				t.Errorf("the other three files should check ok:\n%s", text)
			}
			js, code := runKiln(t, "inspect", dir, "--json")
			if code != 1 || !strings.Contains(js, `"ok": false`) {
				t.Errorf("kiln inspect --json: exit %d, want 1 and ok false:\n%s", code, js)
			}
		})
	}
}

// What is not a pxe output, or its metadata missing, is an error that says so.
func TestInspectPXERefuses(t *testing.T) {
	out, md := pxeOutputs(t)
	other := filepath.Join(out, "notes")
	os.Mkdir(other, 0o755)
	md.PXE = nil
	data, _ := json.Marshal(md)
	noPXE := filepath.Join(out, "qemu-worker-pxe")
	os.Mkdir(noPXE, 0o755)
	os.WriteFile(filepath.Join(out, "qemu-worker.json"), data, 0o644)
	os.Remove(filepath.Join(out, "metal-worker.json"))
	for arg, want := range map[string]string{
		other:                                  "not a pxe output",
		filepath.Join(out, "metal-worker-pxe"): "metal-worker.json: the image metadata the bake writes beside its outputs is missing",
		noPXE:                                  "has no pxe object",
	} {
		text, code := runKiln(t, "inspect", arg)
		if code != 1 || !strings.Contains(text, want) {
			t.Errorf("kiln inspect %s: exit %d, want 1 and %q:\n%s", arg, code, want, text)
		}
	}
}
