package vm

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// ProbeKVM boots kernel under KVM with no root filesystem and panic=-1, so a working KVM
// guest panics and QEMU exits within a second or two. /dev/kvm existing is not enough: on some
// hosts (nested virtualisation) KVM guests hang without printing anything; the bounded boot
// tells the two apart.
func ProbeKVM(ctx context.Context, kernel string, timeout time.Duration) error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("/dev/kvm: %w", err)
	}
	f.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "qemu-system-x86_64", "-machine", "q35,accel=kvm", "-m", "256",
		"-nodefaults", "-no-user-config", "-display", "none", "-monitor", "none", "-serial", "stdio",
		"-no-reboot", "-kernel", kernel, "-append", "console=ttyS0 panic=-1 quiet")
	out, err := cmd.CombinedOutput()
	switch {
	case ctx.Err() != nil:
		return fmt.Errorf("KVM test boot did not finish within %s (KVM hangs on this host)", timeout)
	case err != nil:
		return fmt.Errorf("KVM test boot: %v: %s", err, lastLine(out))
	case !bytes.Contains(out, []byte("Kernel panic")):
		return fmt.Errorf("KVM test boot ended without the kernel running: %s", lastLine(out))
	}
	return nil
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// ChooseAccel resolves want ("auto", "kvm" or "tcg"; empty means $KILN_ACCEL or auto). For
// auto it boots kernel under KVM with ProbeKVM and falls back to TCG, returning why.
func ChooseAccel(ctx context.Context, want, kernel string) (accel, why string, err error) {
	if want == "" {
		want = os.Getenv("KILN_ACCEL")
	}
	switch want {
	case "", "auto":
		if err := ProbeKVM(ctx, kernel, 10*time.Second); err != nil {
			return "tcg", "KVM unusable: " + err.Error(), nil
		}
		return "kvm", "KVM test boot succeeded", nil
	case "kvm", "tcg":
		return want, "forced", nil
	default:
		return "", "", fmt.Errorf("accelerator %q: want auto, kvm or tcg", want)
	}
}
