package source

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/kilnproject/kiln/internal/nodeimage"
)

// FWCfg reads the config that QEMU passes through its fw_cfg device. The kernel exposes
// the item at <sysfs>/firmware/qemu_fw_cfg/by_name/opt/dev.kiln/config/raw once the
// qemu_fw_cfg module is loaded; Probe loads it once if the directory is missing.
//
// A FWCfg must not be copied after first use.
type FWCfg struct {
	// Sysfs is where sysfs is mounted; "" means /sys.
	Sysfs string
	// LoadModule loads the qemu_fw_cfg driver; nil means running
	// `modprobe qemu_fw_cfg`, bounded by ModprobeTimeout.
	LoadModule func(ctx context.Context) error
	// ModprobeTimeout bounds the default LoadModule; 0 means 5s.
	ModprobeTimeout time.Duration

	triedModule bool
}

// Name implements Provider.
func (*FWCfg) Name() string { return "fw_cfg" }

func (f *FWCfg) sysfs() string {
	if f.Sysfs == "" {
		return "/sys"
	}
	return f.Sysfs
}

func (f *FWCfg) deviceDir() string {
	return filepath.Join(f.sysfs(), "firmware", "qemu_fw_cfg")
}

// RawPath is the sysfs file that holds the config's bytes.
func (f *FWCfg) RawPath() string {
	return filepath.Join(f.deviceDir(), "by_name", filepath.FromSlash(nodeimage.FWCfgName), "raw")
}

// Probe implements Provider: true when the fw_cfg device carries the kiln config item.
// Without the device directory it tries to load qemu_fw_cfg once; a failure to load it
// (not a QEMU machine, no module) just means the source is absent.
func (f *FWCfg) Probe(ctx context.Context) bool {
	if _, err := os.Stat(f.deviceDir()); err != nil && !f.triedModule {
		f.triedModule = true
		_ = f.loadModule(ctx)
	}
	return isRegular(f.RawPath())
}

func (f *FWCfg) loadModule(ctx context.Context) error {
	if f.LoadModule != nil {
		return f.LoadModule(ctx)
	}
	timeout := f.ModprobeTimeout
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, "modprobe", "qemu_fw_cfg").CombinedOutput()
	if err != nil {
		return fmt.Errorf("modprobe qemu_fw_cfg: %w: %s", err, out)
	}
	return nil
}

// Fetch implements Provider.
func (f *FWCfg) Fetch(ctx context.Context) ([]byte, error) {
	return readFileLimited(f.RawPath())
}
