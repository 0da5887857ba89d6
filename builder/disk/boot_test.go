package disk

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/builder/initramfs"
	"github.com/kilnproject/kiln/internal/testkit"
)

// probeInit stands in for kiln-init: it loads the modules, mounts the
// second partition of the virtio disk read-only with the rootfstype= of the
// command line and reports what it finds, then powers off.
const probeInit = `package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"
	"unsafe"
)

func main() {
	syscall.Mount("devtmpfs", "/dev", "devtmpfs", 0, "")
	syscall.Mount("proc", "/proc", "proc", 0, "")
	syscall.Mount("sysfs", "/sys", "sysfs", 0, "")
	cmdline, _ := os.ReadFile("/proc/cmdline")
	fmt.Printf("KILN-TEST cmdline %s", cmdline)
	data, _ := os.ReadFile("/etc/kiln/modules.load")
	empty, _ := syscall.BytePtrFromString("")
	for _, m := range strings.Fields(string(data)) {
		if f, err := os.Open(m); err == nil {
			syscall.Syscall(313, f.Fd(), uintptr(unsafe.Pointer(empty)), 0) // finit_module
			f.Close()
		}
	}
	fstype := ""
	for _, arg := range strings.Fields(string(cmdline)) {
		if v, ok := strings.CutPrefix(arg, "rootfstype="); ok {
			fstype = v
		}
	}
	for i := 0; i < 300; i++ {
		if _, err := os.Stat("/dev/vda2"); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := syscall.Mount("/dev/vda2", "/sysroot", fstype, syscall.MS_RDONLY, ""); err != nil {
		fmt.Println("KILN-TEST mount root:", err)
	} else if osr, err := os.ReadFile("/sysroot/etc/os-release"); err != nil {
		fmt.Println("KILN-TEST read os-release:", err)
	} else {
		for _, l := range strings.Split(string(osr), "\n") {
			if strings.HasPrefix(l, "PRETTY_NAME=") {
				fmt.Println("KILN-TEST root ok", l)
			}
		}
	}
	syscall.Sync()
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
}
`

// OVMF firmware code and variable store the UEFI boot test starts QEMU with.
const (
	ovmfCode = "/usr/share/OVMF/OVMF_CODE_4M.fd"
	ovmfVars = "/usr/share/OVMF/OVMF_VARS_4M.fd"
)

// TestBootUEFI bakes the root tree named by KILN_TEST_ROOTFS (e.g. the
// extracted base.tar) into a disk and boots it with OVMF in QEMU (TCG):
// firmware, systemd-boot, the loader entry, the kernel and initramfs on
// the ESP and the root filesystem on root-a must all work together.
func TestBootUEFI(t *testing.T) {
	root, kver := testkit.RootFS(t)
	qemu := testkit.Tool(t, "qemu-system-x86_64", "qemu-system-x86")
	if _, err := os.Stat(ovmfCode); err != nil {
		t.Skip("OVMF not installed")
	}
	dir := t.TempDir()
	initrd := writeProbeInitrd(t, dir, root, kver)

	for _, fsType := range []string{SquashFS, EROFS} {
		if only := os.Getenv("KILN_TEST_FSTYPE"); only != "" && only != fsType {
			continue
		}
		t.Run(fsType, func(t *testing.T) {
			img := filepath.Join(dir, fsType+".img")
			start := time.Now()
			if err := MakeRootFS(context.Background(), root, img, RootFSOptions{Type: fsType}); err != nil {
				t.Fatal(err)
			}
			t.Logf("MakeRootFS %s: %d MB in %s", fsType, size(t, img)>>20, time.Since(start).Round(time.Millisecond))

			path := filepath.Join(dir, fsType+".raw")
			start = time.Now()
			res, err := Build(path, Spec{
				Size: 2 << 30, RootFS: img, RootFSType: fsType,
				Kernel:     filepath.Join(root, "boot", "vmlinuz-"+kver),
				Initrd:     initrd,
				Bootloader: filepath.Join(root, "usr/lib/systemd/boot/efi/systemd-bootx64.efi"),
				Platform:   "qemu", Cmdline: "console=ttyS0,115200 panic=-1",
				ImageJSON: []byte(`{"name":"boot-test"}`), Title: "kiln boot test",
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("Build: %s", time.Since(start).Round(time.Millisecond))
			defer os.Remove(path)

			console := bootUEFI(t, qemu, path)
			var cmdline string
			for _, l := range strings.Split(console, "\n") {
				if i := strings.Index(l, "KILN-TEST cmdline "); i >= 0 {
					cmdline = strings.TrimSpace(l[i+len("KILN-TEST cmdline "):])
				}
			}
			// systemd-boot adds initrd=<path> for the kernel's EFI stub.
			if !strings.Contains(cmdline, res.Cmdline) {
				t.Errorf("kernel command line %q lacks the loader entry's %q", cmdline, res.Cmdline)
			}
			if !strings.Contains(console, "KILN-TEST root ok PRETTY_NAME=") {
				t.Errorf("root-a was not mounted; console:\n%s", console)
			}
		})
	}
}

// writeProbeInitrd writes an initramfs into dir whose init is probeInit and returns its path.
func writeProbeInitrd(t *testing.T, dir, root, kver string) string {
	t.Helper()
	initrd := filepath.Join(dir, "initrd.img")
	f, err := os.Create(initrd)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := initramfs.Write(f, initramfs.Spec{Root: root, KernelVersion: kver, Init: testkit.GoProgram(t, probeInit),
		Modules: []string{"virtio_pci", "virtio_blk", "squashfs", "erofs"}}); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return initrd
}

// bootUEFI boots the disk at path under OVMF in QEMU until it powers off and returns the console.
func bootUEFI(t *testing.T, qemu, path string) string {
	t.Helper()
	varsCopy := filepath.Join(t.TempDir(), "vars.fd")
	b, err := os.ReadFile(ovmfVars)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(varsCopy, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemu, "-accel", "tcg", "-machine", "q35", "-m", "1024",
		"-nographic", "-no-reboot", "-nic", "none",
		"-drive", "if=pflash,format=raw,readonly=on,file="+ovmfCode,
		"-drive", "if=pflash,format=raw,file="+varsCopy,
		"-drive", "if=virtio,format=raw,file="+path)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err = cmd.Run()
	t.Logf("QEMU ran %s (%v)", time.Since(start).Round(time.Millisecond), err)
	return out.String()
}
