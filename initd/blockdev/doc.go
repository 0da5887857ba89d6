// Package blockdev knows the node's block devices, for every part of kiln-init that must
// pick, check or mount one: what blkid finds on a device (Probe), whether a device is on the
// boot disk or in use (DeviceUse, OnBootDisk, WholeDiskUse, from sysfs, mountinfo and
// /proc/swaps), the /dev/disk/by-id names udev would give a disk (ReadDiskIDs, for the
// initramfs where udev does not run), systemd mount units and mounts (MountUnit, WriteUnit,
// Mount), and running the tools (RunTool). It imports no other phase of kiln-init; the etcd
// volume (package etcdvolume), the storage stage and stage 1 build on it.
package blockdev
