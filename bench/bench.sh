#!/usr/bin/env bash
# make bench: prints kiln's figures for the default worker image.
#   - bake time, cold (empty artifact cache, page cache dropped when root) and warm
#   - the floor: mksquashfs alone on the same base tree, with the same options; the ratio
#   - boot time under TCG to kiln-init's first-boot status line (first and second boot)
#   - image sizes: raw (apparent and allocated), qcow2
# Needs the base (make base) and bin/kiln, bin/kiln-init (make build).
set -euo pipefail
cd "$(dirname "$0")/.."
export KILN_CACHE=${KILN_CACHE:-$HOME/.cache/kiln}
KILN=$PWD/bin/kiln
work=$(mktemp -d /var/tmp/kiln-bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

$KILN lock images/qemu.yaml >/dev/null

# Cold: a fresh artifact cache (the base layout is the input and stays), no page cache.
cold_cache=$work/cache
mkdir -p "$cold_cache"
ln -s "$KILN_CACHE/base" "$cold_cache/base"
sync; [ "$(id -u)" = 0 ] && echo 3 > /proc/sys/vm/drop_caches || true
t0=$(now)
KILN_CACHE=$cold_cache $KILN bake images/qemu.yaml --role worker -o "$work/cold" 2> "$work/cold.log" >/dev/null
t1=$(now)
$KILN bake images/qemu.yaml --role worker -o "$work/warm" 2> "$work/warm.log" >/dev/null
t2=$(now)
cold=$(secs "$t0" "$t1"); warm=$(secs "$t1" "$t2")

# The floor: the base layer extracted, then mksquashfs with the bake's options.
digest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["base"]["digest"])' images/qemu.lock)
manifest=$KILN_CACHE/base/blobs/sha256/${digest#sha256:}
layer=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["layers"][0]["digest"])' "$manifest")
mkdir -p "$work/tree"
tar -C "$work/tree" -xzf "$KILN_CACHE/base/blobs/sha256/${layer#sha256:}" --exclude='./dev/*'
t3=$(now)
mksquashfs "$work/tree" "$work/floor.squashfs" -noappend -no-progress -reproducible \
  -mkfs-time 0 -all-time 0 -comp zstd -Xcompression-level 3 -quiet >/dev/null
t4=$(now)
floor=$(secs "$t3" "$t4")

# Boots under TCG: first boot (creates /var) and second boot of the same disk.
cp --sparse=always "$work/warm/qemu-worker.raw" "$work/boot.raw"
boot() {
  local t0 t1
  t0=$(now)
  $KILN run "$work/boot.raw" --accel tcg --config images/examples/worker.ign --until-firstboot --timeout 10m > "$work/boot$1.log" 2>&1
  t1=$(now)
  local guest
  guest=$(grep -a 'kiln-init: firstboot' "$work/boot$1.log" | tail -1 | sed -n 's/^\[ *\([0-9.]*\)\].*/\1/p')
  echo "$(secs "$t0" "$t1") ${guest:-?}"
}
read -r b1 g1 < <(boot 1)
read -r b2 g2 < <(boot 2)

raw=$work/warm/qemu-worker.raw
printf '\nkiln bench (worker image, %s, %s cores)\n' "$(uname -r)" "$(nproc)"
printf '  bake cold                     %6s s\n' "$cold"
printf '  bake warm                     %6s s\n' "$warm"
printf '  mksquashfs alone (floor)      %6s s   warm bake / floor = %s\n' "$floor" "$(awk -v a="$warm" -v b="$floor" 'BEGIN { printf "%.2f", a / b }')"
grep -h 'seconds=' "$work/warm.log" | sed -n 's/.*msg="\{0,1\}\([^"=]*\)"\{0,1\} .*seconds=\([0-9.]*\).*/    warm step: \1 \2 s/p' | grep -v 'root filesystem made.*type' || true
printf '  first boot to status line     %6s s wall (guest clock %s s)\n' "$b1" "$g1"
printf '  second boot to status line    %6s s wall (guest clock %s s)\n' "$b2" "$g2"
printf '  raw                           %6s MiB apparent, %s MiB allocated\n' "$(( $(stat -c %s "$raw") >> 20 ))" "$(( $(stat -c %b "$raw") * 512 >> 20 ))"
printf '  qcow2                         %6s MiB\n' "$(( $(stat -c %s "$work/warm/qemu-worker.qcow2") >> 20 ))"
printf '  root squashfs (floor tree)    %6s MiB\n' "$(( $(stat -c %s "$work/floor.squashfs") >> 20 ))"
