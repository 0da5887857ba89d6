package vm

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// NetBoot is a network boot through the user network's NIC, the way a rack's machines PXE-boot:
// the firmware (OVMF) runs the NIC's option ROM, iPXE (QEMU's efi-virtio.rom, from Debian's
// ipxe-qemu), which asks QEMU's DHCP server for an address and a boot file and chains it.
//
// The NIC's boot index comes after the root disk's, so the firmware boots the disk when it can
// (an installed machine) and falls through to the network when it cannot: a diskless machine,
// a blank disk, a disk without an ESP.
type NetBoot struct {
	// BootFile is the URL of the iPXE script (or EFI program) that DHCP hands out, e.g.
	// http://10.0.2.2:8080/boot.ipxe for `kiln serve` on the host's port 8080.
	BootFile string
	// MAC is the NIC's address, the one `kiln serve` matches machines by; QEMU's
	// 52:54:00:12:34:56 when empty.
	MAC string
}

// netBootIndex is the user NIC's boot index: after the root disk's 0.
const netBootIndex = 1

// nicOptions are the user NIC's options for nb: its MAC and its boot index.
func (nb *NetBoot) nicOptions() (string, error) {
	opts := ""
	if nb.MAC != "" {
		mac, err := normalMAC(nb.MAC)
		if err != nil {
			return "", fmt.Errorf("network boot: %w", err)
		}
		opts += ",mac=" + mac
	}
	return opts + ",bootindex=" + strconv.Itoa(netBootIndex), nil
}

// userOption is the user netdev's bootfile= option for nb.
func (nb *NetBoot) userOption() (string, error) {
	u, err := url.Parse(nb.BootFile)
	switch {
	case err != nil:
		return "", fmt.Errorf("network boot file %q: %w", nb.BootFile, err)
	case u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "tftp":
		return "", fmt.Errorf("network boot file %q: want an http://, https:// or tftp:// URL iPXE can fetch, e.g. http://10.0.2.2:8080/boot.ipxe", nb.BootFile)
	case u.Host == "":
		return "", fmt.Errorf("network boot file %q: the URL names no host (the host is 10.0.2.2 on the user network)", nb.BootFile)
	case strings.ContainsAny(nb.BootFile, " \t\n\"'"):
		return "", fmt.Errorf("network boot file %q: spaces and quotes do not survive DHCP's boot file option", nb.BootFile)
	}
	// The BOOTP file field holds 127 bytes and a NUL; QEMU 7.2's slirp aborts with a
	// segmentation fault on a longer one.
	if len(nb.BootFile) > 127 {
		return "", fmt.Errorf("network boot file %q: %d bytes, QEMU's DHCP server hands out at most 127", nb.BootFile, len(nb.BootFile))
	}
	return ",bootfile=" + qemuEscape(nb.BootFile), nil
}
