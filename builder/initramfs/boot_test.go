package initramfs

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kilnproject/kiln/internal/testkit"
)

// bootInit loads the modules listed in modules.load, prints what the kernel
// reports and powers off: enough to prove the kernel unpacks the archive,
// opens /dev/console and accepts the module files in that order.
const bootInit = `package main

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"unsafe"
)

func main() {
	if err := syscall.Mount("proc", "/proc", "proc", 0, ""); err != nil {
		fmt.Println("KILN-TEST mount proc:", err)
	}
	data, err := os.ReadFile("/etc/kiln/modules.load")
	if err != nil {
		fmt.Println("KILN-TEST read modules.load:", err)
	}
	empty, _ := syscall.BytePtrFromString("")
	for _, m := range strings.Fields(string(data)) {
		f, err := os.Open(m)
		if err != nil {
			fmt.Println("KILN-TEST open:", err)
			continue
		}
		_, _, e := syscall.Syscall(313 /* finit_module on amd64 */, f.Fd(), uintptr(unsafe.Pointer(empty)), 0)
		f.Close()
		if e != 0 && e != syscall.EEXIST {
			fmt.Printf("KILN-TEST load %s: %v\n", m, e)
		}
	}
	mods, _ := os.ReadFile("/proc/modules")
	for _, l := range strings.Split(string(mods), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			fmt.Println("KILN-TEST loaded", f[0])
		}
	}
	fmt.Println("KILN-TEST done")
	syscall.Reboot(syscall.LINUX_REBOOT_CMD_POWER_OFF)
}
`

// TestBootRealKernel boots the kernel of the root tree named by
// KILN_TEST_ROOTFS in QEMU (TCG) with an initramfs from Write.
func TestBootRealKernel(t *testing.T) {
	root, kver := testkit.RootFS(t)
	qemu := testkit.Tool(t, "qemu-system-x86_64", "qemu-system-x86")
	kernel := filepath.Join(root, "boot", "vmlinuz-"+kver)

	for _, comp := range []string{Zstd, Gzip, None} {
		t.Run(comp, func(t *testing.T) {
			initrd := filepath.Join(t.TempDir(), "initrd.img")
			f, err := os.Create(initrd)
			if err != nil {
				t.Fatal(err)
			}
			man, err := Write(f, Spec{Root: root, KernelVersion: kver, Init: testkit.GoProgram(t, bootInit), Compression: comp,
				Modules: []string{"virtio_pci", "virtio_blk", "virtio_scsi", "sd_mod", "squashfs", "erofs", "overlay", "crc32c_generic"}})
			if err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, qemu, "-accel", "tcg", "-m", "512", "-nographic", "-no-reboot",
				"-kernel", kernel, "-initrd", initrd, "-append", "console=ttyS0 panic=-1 loglevel=4")
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			start := time.Now()
			err = cmd.Run()
			t.Logf("initrd %d bytes (%s); qemu ran %s (%v)", fileSize(t, initrd), comp, time.Since(start).Round(time.Millisecond), err)
			console := out.String()
			if !strings.Contains(console, "KILN-TEST done") {
				t.Fatalf("the init did not finish; console:\n%s", console)
			}
			for _, l := range strings.Split(console, "\n") {
				if strings.Contains(l, "KILN-TEST load ") || strings.Contains(l, "KILN-TEST open:") {
					t.Errorf("%s", strings.TrimSpace(l))
				}
			}
			for _, m := range man.Modules {
				name := moduleName(m)
				if !strings.Contains(console, "KILN-TEST loaded "+name+"\r") && !strings.Contains(console, "KILN-TEST loaded "+name+"\n") {
					t.Errorf("module %s not in /proc/modules", name)
				}
			}
		})
	}
}

func fileSize(t *testing.T, name string) int64 {
	t.Helper()
	fi, err := os.Stat(name)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}
