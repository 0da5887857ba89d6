#!/usr/bin/env bash
# bench/stage1.sh [BEFORE]: what the initramfs' /init costs a boot, before and after.
# BEFORE is a static init to compare against: a file, or a git revision whose kiln-init was
# also the initramfs' /init (default c014297, the last such commit; built here). AFTER is
# bin/kiln-stage1 (make build). It bakes the default worker image with each as /init and
# prints:
#   - the init's size and the initramfs' (zstd), as image.json records it;
#   - under TCG, RUNS boots of each (A B A B …, --snapshot, so every one is a first boot):
#     the guest kernel's clock at "Freeing initrd memory" (the archive unpacked), at
#     "Run /init" and at systemd's first line (the switch_root done), and the wall time from
#     kiln run's start to that line; each run, then the medians.
# Needs the base (make base), bin/kiln, bin/kiln-init, bin/kiln-stage1 (make build).
set -euo pipefail
trap 'echo "bench/stage1: failed at line $LINENO (logs in $work)" >&2' ERR
cd "$(dirname "$0")/.."
export KILN_CACHE=${KILN_CACHE:-$HOME/.cache/kiln}
KILN=$PWD/bin/kiln
RUNS=${RUNS:-3}
before=${1:-c014297}
work=$(mktemp -d /var/tmp/kiln-stage1.XXXXXX)
now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

if [ ! -f "$before" ]; then
  git worktree add -q --detach "$work/src" "$before"
  (cd "$work/src" && CGO_ENABLED=0 ${GO:-go} build -trimpath -ldflags "-s -w" -o "$work/init-before" ./initd/cmd/kiln-init)
  git worktree remove --force "$work/src"
  before_name="kiln-init at $before"
  before=$work/init-before
else
  before_name=$before
fi

overlay=()
[ -n "${KILN_PROFILE_OVERLAY:-}" ] && overlay=(--profile-overlay "$KILN_PROFILE_OVERLAY")
$KILN lock --update images/qemu.yaml "${overlay[@]}" >/dev/null
$KILN bake images/qemu.yaml --role worker "${overlay[@]}" --kiln-stage1 "$before" -o "$work/a" 2> "$work/a.log" >/dev/null
$KILN bake images/qemu.yaml --role worker "${overlay[@]}" --kiln-stage1 bin/kiln-stage1 -o "$work/b" 2> "$work/b.log" >/dev/null
initrd() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["initramfs"]["size"])' "$1/qemu-worker.json"; }
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }

# ts FILE REGEX: the guest kernel's clock on the first console line matching REGEX.
ts() { grep -a -m1 -E "$2" "$1" | sed -n 's/^\[ *\([0-9.]*\)\].*/\1/p'; }
boot() { # boot a|b N: prints "unpacked run-init systemd wall"
  local log=$work/boot-$1-$2.log t0 t1
  t0=$(now)
  $KILN run "$work/$1/qemu-worker.raw" --snapshot --accel tcg --until 'systemd\[1\]: systemd [0-9]' --timeout 5m > "$log" 2>&1
  t1=$(now)
  echo "$(ts "$log" 'Freeing initrd memory') $(ts "$log" 'Run /init as init process') $(ts "$log" 'systemd\[1\]:') $(secs "$t0" "$t1")"
}
: > "$work/a.runs"; : > "$work/b.runs"
for i in $(seq "$RUNS"); do
  boot a "$i" >> "$work/a.runs"
  boot b "$i" >> "$work/b.runs"
done
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
col() { awk -v c="$2" '{ print $c }' "$1" | median; }

echo "kiln's initramfs /init ($(date -u +%F), $(nproc) cores, TCG, $RUNS boots each, medians)"
printf '  %-34s %16s %16s\n' "" "A: before" "B: kiln-stage1"
printf '  %-34s %16s %16s\n' "init binary" "$(mib "$(stat -c %s "$before")")" "$(mib "$(stat -c %s bin/kiln-stage1)")"
printf '  %-34s %16s %16s\n' "initramfs (zstd)" "$(mib "$(initrd "$work/a")")" "$(mib "$(initrd "$work/b")")"
printf '  %-34s %15.2fs %15.2fs\n' "guest clock: initramfs unpacked" "$(col "$work/a.runs" 1)" "$(col "$work/b.runs" 1)"
printf '  %-34s %15.2fs %15.2fs\n' "guest clock: Run /init" "$(col "$work/a.runs" 2)" "$(col "$work/b.runs" 2)"
printf '  %-34s %15.2fs %15.2fs\n' "guest clock: systemd (switch_root)" "$(col "$work/a.runs" 3)" "$(col "$work/b.runs" 3)"
printf '  %-34s %15.2fs %15.2fs\n' "wall: kiln run start to systemd" "$(col "$work/a.runs" 4)" "$(col "$work/b.runs" 4)"
echo "  A is $before_name; runs (unpacked, /init, systemd, wall):"
paste -d'|' "$work/a.runs" "$work/b.runs" | sed 's/^/    A /; s/|/   B /'
rm -rf "$work"
