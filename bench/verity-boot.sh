#!/usr/bin/env bash
# bench/verity-boot.sh IMAGE.raw [RUNS]: what the verified root costs at boot. Boots IMAGE.raw
# (a bake's worker raw, root mounted through dm-verity) and a copy whose boot entry lacks
# kiln.verity.* (stage 1 then mounts root-a directly), RUNS times each in turn (default 3),
# under TCG to kiln-init's first-boot status line, and prints each run's seconds and the
# medians. Also prints the tree's size from the image's boot entry and partition.
set -euo pipefail
cd "$(dirname "$0")/.."
img=${1:?usage: bench/verity-boot.sh IMAGE.raw [RUNS]}
runs=${2:-3}
KILN=$PWD/bin/kiln
work=$(mktemp -d /var/tmp/kiln-verity.XXXXXX)
trap 'rm -rf "$work"' EXIT

# The copy without verity: the loader entry's options without kiln.verity.*, on the ESP (FAT,
# 1 MiB into the disk) through mtools.
cp --sparse=always "$img" "$work/verified.raw"
cp --sparse=always "$img" "$work/unverified.raw"
esp="$work/unverified.raw@@1M"
mtype -i "$esp" ::/loader/entries/kiln-a.conf | sed -E 's/ kiln\.verity\.[a-z]+=[^ ]+//g' > "$work/entry.conf"
mcopy -o -i "$esp" "$work/entry.conf" ::/loader/entries/kiln-a.conf
grep -q verity "$work/entry.conf" && { echo "verity arguments left in the copy's entry" >&2; exit 1; }

# A worker's config from a one-node cluster, as make bench boots it: first boot completes,
# kubelet keeps retrying its control plane.
"$KILN" cluster init --name bench --dns-zone kiln.test --control-planes 1 --workers 1 \
  --api-endpoint 10.0.2.2:6443 -o "$work/cluster" >/dev/null
boot() { # prints the seconds from QEMU's start to the first-boot line
  local t0 t1
  t0=$(date +%s.%N)
  "$KILN" run "$1" --snapshot --config "$work/cluster/bench-worker-1.ign" --until-firstboot --accel tcg \
    >"$work/boot.log" 2>&1 || { echo "boot of $1 failed:" >&2; tail -5 "$work/boot.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f\n", b - a }'
}
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
: > "$work/v"; : > "$work/u"
for i in $(seq "$runs"); do
  boot "$work/verified.raw" >> "$work/v"
  boot "$work/unverified.raw" >> "$work/u"
done
echo "boot to first-boot line (s), TCG, $runs runs each, alternating"
echo "  verified:   $(tr '\n' ' ' < "$work/v")  median $(median < "$work/v")"
echo "  unverified: $(tr '\n' ' ' < "$work/u")  median $(median < "$work/u")"
"$KILN" inspect "$img" | grep '^verity:'
