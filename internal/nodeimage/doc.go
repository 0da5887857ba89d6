// Package nodeimage is the contract between the bake (builder/, `kiln bake`) and the node's boot
// (initd/, kiln-init) and `kiln run`: every name, path and format one side writes and the other
// reads is declared here once, and both sides use these declarations instead of their own
// literals.
//
// What the bake writes, and where:
//
//   - The disk is GPT. Partition 1 is the EFI system partition (GPT name ESPName, FAT label
//     ESPLabel); partitions 2 and 3 are the A/B root slots RootAName and RootBName (type
//     TypeRootX86), of which the bake fills root-a and leaves root-b empty. The space after
//     root-b is left for the data partition.
//   - On the ESP: the bootloader at BootloaderPath, the loader configuration at LoaderConfPath
//     naming LoaderEntryName (at LoaderEntryPath) as its default, slot A's kernel and initramfs
//     at KernelPath and InitrdPath, and the image metadata at ESPImageJSONPath.
//   - In the initramfs: the ordered kernel module list at ModulesLoadPath.
//   - In the root filesystem: the image metadata at ImageJSONPath (the same document as on the
//     ESP, schema Metadata), the role's templates under TemplatesPath, the pre-pulled container
//     images as an OCI image layout at ImagesPath and, when the role's overlays carry one, the
//     image's default Ignition config at EmbeddedConfigPath.
//   - With the pxe format, beside the disk: the directory <image>-<role>+PXEDirSuffix holding
//     the ESP's kernel and initramfs, root-a's root filesystem image and a live-boot iPXE
//     script (PXEKernelName, PXEInitrdName, PXERootFSName, PXEScriptName), described with their
//     sha256 and the network boot's kernel arguments by Metadata.PXE in <image>-<role>.json.
//   - With the iso format, beside the disk: <image>-<role>+ISOSuffix, a live-booting ISO 9660
//     volume (ISOLabel) with the root filesystem image at ISORootFSPath and an El Torito UEFI
//     boot image (ISOBootImagePath) holding the ESP's boot files.
//
// What the node reads:
//
//   - Stage 1 (the initramfs) loads the modules of ModulesLoadPath, finds root-a by the
//     PARTUUID on the kernel command line, and on first boot adds the partition DataName (type
//     TypeLinuxData) after the last one and makes an ext4 filesystem labelled DataLabel on it.
//   - First boot reads ImageJSONPath (role, platform), merges the user's config over
//     EmbeddedConfigPath, renders TemplatesPath and imports ImagesPath, and prints one status
//     line on the console (FormatOK, FormatFailed, FormatDone).
//   - `kiln run` passes a node config as the fw_cfg item FWCfgName, reads the kernel, initramfs
//     and loader entry from the ESP for direct kernel boots, and waits for the status line
//     (StatusLineRE, ParseStatusLine).
package nodeimage
