package stage1

import (
	"errors"
	"os"
	"strings"
	"unicode/utf16"

	"golang.org/x/sys/unix"
)

// efivarsDir is where efivarfs shows the firmware's variables; loaderBootCountVar is the
// variable systemd-boot sets when it boots an entry with boot counting: the entry's path on
// the ESP.
const (
	efivarsDir         = "/sys/firmware/efi/efivars"
	loaderBootCountVar = "LoaderBootCountPath-4a67b082-0a4c-41cf-b6c7-440b29bb8c4f"
)

// TrialEntry says whether this boot is a try of a boot entry on trial (an update not yet found
// good) and names the entry: systemd-boot counts the try only when the machine boots again, so
// a stage 1 that fails on trial reboots rather than waits. It mounts efivarfs when needed; a
// machine without UEFI, or an entry without counting, is not on trial.
func TrialEntry() (string, bool) {
	if _, err := os.Stat("/sys/firmware/efi"); err != nil {
		return "", false
	}
	if _, err := os.Stat(efivarsDir + "/" + loaderBootCountVar); errors.Is(err, os.ErrNotExist) {
		if err := unix.Mount("efivarfs", efivarsDir, "efivarfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC|unix.MS_RDONLY, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return "", false
		}
	}
	b, err := os.ReadFile(efivarsDir + "/" + loaderBootCountVar)
	if err != nil || len(b) < 6 {
		return "", false
	}
	p := decodeUTF16(b[4:]) // the variable's attributes come first
	if !strings.Contains(p, "+") {
		return "", false
	}
	return p, true
}

// decodeUTF16 reads a NUL-terminated UTF-16LE string.
func decodeUTF16(b []byte) string {
	u := make([]uint16, 0, len(b)/2)
	for i := 0; i+1 < len(b); i += 2 {
		c := uint16(b[i]) | uint16(b[i+1])<<8
		if c == 0 {
			break
		}
		u = append(u, c)
	}
	return string(utf16.Decode(u))
}
