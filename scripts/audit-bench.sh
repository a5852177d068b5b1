#!/usr/bin/env bash
# How fast `relay audit verify` checks a large log on this machine: writes
# a store of EVENTS events (actors/examples/audit_log.rs, through the
# store's batches; skipped when DIR already has one), then times RUNS runs
# of `relay audit --data-dir DIR verify` (warm page cache: the first run
# reads the files once more beforehand) and prints each run's wall and CPU
# time (user + sys) and their medians.
#
#   scripts/audit-bench.sh [DIR] [EVENTS]     # defaults: a temporary dir, 1,000,000
#   RUNS=5 scripts/audit-bench.sh big-log
#
# Builds what it runs (the `fastest` profile, as every figure in the
# performance journal: target/fastest/relay and the example).
set -euo pipefail
cd "$(dirname "$0")/.."
EVENTS="${2:-1000000}"
RUNS="${RUNS:-3}"
if [ -n "${1:-}" ]; then
  DIR="$1"
else
  DIR="$(mktemp -d)"
  trap 'rm -rf "$DIR"' EXIT
fi
cargo build --profile fastest --quiet --bin relay
cargo build --profile fastest --quiet -p relay-actors --example audit_log
if [ ! -e "$DIR/store" ]; then
  mkdir -p "$DIR"
  target/fastest/examples/audit_log "$DIR" "$EVENTS"
fi
du -sh "$DIR/store" | sed 's/^/store: /'
# Warm the page cache (and check the store is clean).
target/fastest/relay audit --data-dir "$DIR" verify | tail -n 1
walls=() cpus=()
for i in $(seq "$RUNS"); do
  out="$( { /usr/bin/time -f '%e %U %S' target/fastest/relay audit --data-dir "$DIR" verify >"$DIR.last"; } 2>&1 )"
  read -r wall user sys <<<"$(tail -n 1 <<<"$out")"
  cpu="$(awk -v u="$user" -v s="$sys" 'BEGIN {print u + s}')"
  summary="$(tail -n 1 "$DIR.last")"
  echo "run $i: $summary"
  echo "run $i: wall ${wall} s, cpu ${cpu} s (user ${user}, sys ${sys})"
  walls+=("$wall") cpus+=("$cpu")
done
rm -f "$DIR.last"
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
events="$(grep -o '[0-9]* events,' <<<"$summary" | head -n 1 | cut -d' ' -f1)"
wall="$(median "${walls[@]}")"
cpu="$(median "${cpus[@]}")"
awk -v n="$RUNS" -v e="$events" -v w="$wall" -v c="$cpu" \
  'BEGIN {printf "median of %d: wall %.2f s (%.0f events/s), cpu %.2f s (%.0f events per CPU-second)\n", n, w, e / w, c, e / c}'
