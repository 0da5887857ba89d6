package netboot

import (
	"fmt"
	"strings"
)

// chainScript asks iPXE for the machine's own script, passing what identifies it: the MAC
// of its first NIC (hyphenated, as hexhyp prints it), the SMBIOS UUID and the DHCP host
// name (URI-encoded). When that fails (no machine matches: 404) it says so and exits, so
// the firmware goes on to its next boot device.
func chainScript(base string) string {
	return fmt.Sprintf(`#!ipxe
# kiln serve: fetch this machine's own boot script
chain %s/boot.ipxe?mac=${net0/mac:hexhyp}&uuid=${uuid}&hostname=${hostname:uristring} || goto failed
:failed
echo kiln serve at %s has no boot for ${net0/mac} (uuid ${uuid}), its log says why
sleep 10
exit 1
`, base, base)
}

// machineScript boots e: the image's kernel and initramfs with the mode's parameters.
func machineScript(base string, e *entry) string {
	pxe := base + "/images/" + e.image.md.PXE.Dir + "/"
	var b strings.Builder
	fmt.Fprintf(&b, "#!ipxe\n# kiln serve: machine %s, group %s, %s %s\n", e.ID, e.Group.Name, e.Group.Mode, e.image.name)
	fmt.Fprintf(&b, "kernel %s%s initrd=%s %s\n", pxe, e.image.md.PXE.Kernel.File, e.image.md.PXE.Initrd.File, strings.Join(kernelArgs(base, e), " "))
	fmt.Fprintf(&b, "initrd %s%s\n", pxe, e.image.md.PXE.Initrd.File)
	b.WriteString("boot\n")
	return b.String()
}

// kernelArgs is e's kernel command line after initrd=: the image's arguments, the mode's,
// the config URL, then the group's and the machine's extra arguments.
func kernelArgs(base string, e *entry) []string {
	args := strings.Fields(e.image.md.PXE.KernelArgs)
	if !hasPrefix(args, "kiln.platform=") {
		args = append(args, "kiln.platform=metal")
	}
	switch e.Group.Mode {
	case ModeLive:
		args = append(args,
			"kiln.live.rootfs_url="+base+"/images/"+e.image.rootfs.name,
			"kiln.live.rootfs_sha256="+e.image.rootfs.sha256)
	case ModeInstall:
		args = append(args,
			"kiln.install.dev="+e.Group.Install.Dev,
			"kiln.install.image_url="+base+"/images/"+e.install.name,
			"kiln.install.image_sha256="+e.install.sha256)
		if e.Group.Install.Wipe {
			args = append(args, "kiln.install.wipe=1")
		}
	}
	if e.config != nil {
		args = append(args, "kiln.config.url="+base+"/config/"+e.ID)
	}
	args = append(args, e.Group.KernelArgs...)
	return append(args, e.KernelArgs...)
}

func hasPrefix(args []string, prefix string) bool {
	for _, a := range args {
		if strings.HasPrefix(a, prefix) {
			return true
		}
	}
	return false
}

// unknownScript is the body of a 404 for a machine no entry selects: what it sent and why
// it got nothing, for whoever reads it (iPXE itself does not run a 404's body).
func unknownScript(id ident, reason string) string {
	return fmt.Sprintf(`#!ipxe
echo kiln serve: no boot for mac %s uuid %s hostname %s: %s
sleep 10
exit 1
`, orDash(id.mac), orDash(id.uuid), orDash(id.hostname), reason)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
