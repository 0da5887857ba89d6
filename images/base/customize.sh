#!/usr/bin/env bash
# mmdebstrap customize hook: trims the tree to what an immutable kiln root needs.
# $1 is the root of the tree being built.
set -euo pipefail
root=$1
# kiln builds its own initramfs: build.sh has the kernel package make none, and any other is
# never used.
rm -f "$root"/boot/initrd.img* "$root"/boot/*.old
# build.sh's force-unsafe-io is for the build only (mmdebstrap keeps its dpkg options).
sed -i '/^force-unsafe-io$/d' "$root/etc/dpkg/dpkg.cfg.d/99mmdebstrap"
# The package cache and lists are not part of an immutable image.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
# systemd generates a machine id at first boot (/etc is writable then).
: > "$root/etc/machine-id"
rm -f "$root/var/lib/dbus/machine-id"
# The host's identity must not leak into the image: names and resolvers come at first boot.
rm -f "$root/etc/hostname" "$root/etc/resolv.conf" "$root"/initrd.img* "$root"/vmlinuz*
# The package database describes the read-only image, so it lives with /usr: `dpkg -l` works,
# installing fails (as it must on an immutable node), and first boot does not copy its ~740 files
# onto every node's /var (that copy took 13 s of a TCG first boot).
mkdir -p "$root/usr/lib/kiln"
mv "$root/var/lib/dpkg" "$root/usr/lib/kiln/dpkg"
ln -s ../../usr/lib/kiln/dpkg "$root/var/lib/dpkg"
# The root is read-only: homes live on the data partition, like the rest of /var.
mkdir -p "$root/var/home"
rmdir "$root/home" 2>/dev/null || mv "$root/home"/* "$root/var/home"/ 2>/dev/null; rm -rf "$root/home"
ln -s var/home "$root/home"
mv "$root/root" "$root/var/roothome"
ln -s var/roothome "$root/root"
# The ssh server's host keys identify one machine: never baked (the bake's secret guard refuses
# them); ssh.service makes them at its first start (overlays/base). It is not enabled here: a
# node config or a profile enables ssh.service.
rm -f "$root"/etc/ssh/ssh_host_*
rm -f "$root"/etc/systemd/system/multi-user.target.wants/ssh.service "$root"/etc/systemd/system/sshd.service \
  "$root"/etc/systemd/system/sockets.target.wants/ssh.socket
# Groups that configs written for Fedora CoreOS and Flatcar add their users to (sudo is Debian's).
grep -q '^wheel:' "$root/etc/group" || chroot "$root" groupadd --system wheel
