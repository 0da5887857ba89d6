// Package rootfs assembles the root tree of an image: it opens the OCI base image by digest
// (from a registry, an OCI layout or a tarball), verifies every blob it reads, flattens the layers
// into a directory (whiteouts honoured), finds the kernel and systemd-boot in it and copies them
// out, and lets the bake lay files and directories on top, every write resolved inside the tree.
// A registry base's layers are downloaded into the artifact cache under its download retry: a
// body cut short or stalled is fetched again, one that arrives whole but corrupt is refused.
//
// Ownership is recorded rather than trusted to the host: entries that are not owned by root are
// listed in the tree's Owners so the filesystem writer can set them (mksquashfs pseudo definitions)
// even when the bake does not run as root.
package rootfs
