#!/usr/bin/env bash
# Retention soak (issue 39): one relay (`fastest` build) under an open-loop
# load for a while, with a short retention and a frequent sweep; every 10 s
# the data dir's size and the relay's RSS are sampled. Prints the samples,
# then the plateau (mean over the last half) and the slope over the last
# half (bytes per minute; ~0 when disk and memory follow what is retained).
#
#   scripts/retention-soak.sh [RATE] [DURATION] [RETENTION] [SWEEP]
#   defaults: 2000 10m 2m 30s
#
# Run it once more with RETENTION=30d for the same load without deletion
# (the throughput to compare with); on a shared machine run both at once, so
# both meet the same background. Issue 39's pair (journal, 2026-12-06):
#   CHUNK=20s AGE_LIMIT=90s TOLERANCE=30s scripts/retention-soak.sh 2000 10m {2m|30d} 30s AGE_LIMIT and TOLERANCE set
# `limits.delivery_age_limit` and `limits.clock_tolerance` (defaults 90m and
# 5m): a swept message's idempotency entry stays until no retry could pass
# the age check (docs/operate/retention.md), so with a retention shorter than those
# two the live set includes that long a tail. KEEP=DIR moves the relay's data dir
# there at the end (stopped cleanly), for `examples/store_space.rs`.
# CHUNK=60s runs the load as back-to-back `relay bench` runs of that length
# (each signs its envelopes just before it starts), so envelopes are never
# older than a chunk and a short AGE_LIMIT can be used. PROFILE picks the
# cargo profile (default `fastest`); RELAY=PATH runs that binary instead.
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-2000}
duration=${2:-10m}
retention=${3:-2m}
sweep=${4:-30s}

profile=${PROFILE:-fastest}
[ -n "${RELAY:-}" ] || cargo build --profile "$profile" --locked --quiet --bin relay
${KEEP:+cargo build --profile "$profile" --locked --quiet -p relay-actors --example store_space}
dir=$profile; [ "$profile" = dev ] && dir=debug
relay=${RELAY:-${CARGO_TARGET_DIR:-target}/$dir/relay}
work=$(mktemp -d)
finish() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  # sled's rewrites (the store's step 9), with their times.
  grep -h "sled" "$work/relay.log" || true
  if [ -n "${KEEP:-}" ]; then rm -rf "$KEEP" && mv "$work/data" "$KEEP"; fi
  rm -rf "$work"
}
trap finish EXIT

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$work/relay.toml" <<EOF
[relay]
id = "relay-a"
public_url = "http://127.0.0.1:$port"
listen = "127.0.0.1:$port"
data_dir = "$work/data"
key_file = "$work/data/relay.key"
[limits]
message_retention = "$retention"
retention_sweep = "$sweep"
delivery_age_limit = "${AGE_LIMIT:-90m}"
clock_tolerance = "${TOLERANCE:-5m}"
session_rate = 1000000
session_burst = 1000000
anonymous_rate = 1000000
anonymous_burst = 1000000
EOF
RUST_LOG=${RUST_LOG:-warn,relay_actors::store=info} "$relay" serve --config "$work/relay.toml" >"$work/relay.log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  sleep 0.1
done

seconds() { python3 -c "import re,sys; n,u=re.fullmatch(r'(\d+)(s|m|h)','$1').groups(); print(int(n)*{'s':1,'m':60,'h':3600}[u])"; }
secs=$(seconds "$duration")
chunk=$(seconds "${CHUNK:-$duration}")
samples="$work/samples.csv"
echo "t_s,data_bytes,rss_kb,sled_bytes,log_bytes" >"$samples"
(
  start=$(date +%s)
  while kill -0 "$pid" 2>/dev/null; do
    t=$(( $(date +%s) - start ))
    size=$(du -sb "$work/data" | cut -f1)
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
    # sled's files, wherever its last rewrite put them (store/tree.<n>).
    db=$(du -sb --exclude=log --exclude=FORMAT "$work/data/store" 2>/dev/null | cut -f1)
    log=$(du -sb "$work/data/store/log" 2>/dev/null | cut -f1)
    echo "$t,$size,$rss,$db,${log:-0}" >>"$samples"
    sleep 10
  done
) &
sampler=$!
cpu0=$(awk '{print $14+$15}' "/proc/$pid/stat")
began=$(date +%s)
while left=$(( secs - ($(date +%s) - began) )); [ "$left" -gt 0 ]; do
  run=$(( left < chunk ? left : chunk ))
  "$relay" bench --relays "http://127.0.0.1:$port" --relay-ids relay-a --accounts 64 --concurrency 64 \
    --messages $(( rate * (run + 5) )) --rate "$rate" --duration "${run}s" --payload 256 | tee -a "$work/bench.txt"
done
cpu1=$(awk '{print $14+$15}' "/proc/$pid/stat")
sent=$(grep -oE '^ *sent[^0-9]*[0-9,]+' "$work/bench.txt" | tr -d ', ' | grep -oE '[0-9]+$' | paste -sd+ | bc 2>/dev/null || echo 0)
kill "$sampler" 2>/dev/null || true
cat "$samples"
python3 - "$samples" "$rate" "$secs" "$cpu0" "$cpu1" "${sent:-0}" <<'EOF'
import csv, sys
rows = [(int(r["t_s"]), int(r["data_bytes"]), int(r["rss_kb"]), int(r["sled_bytes"]), int(r["log_bytes"]))
        for r in csv.DictReader(open(sys.argv[1]))]
rate, secs, ticks = float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[5]) - int(sys.argv[4])
sent = int(sys.argv[6]) or rate * secs
half = [r for r in rows if r[0] >= rows[-1][0] / 2]
def slope(col):
    xs = [r[0] / 60 for r in half]; ys = [r[col] for r in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs) or 1
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den
plateau_disk = sum(r[1] for r in half) / len(half)
plateau_rss = sum(r[2] for r in half) / len(half) * 1024
print(f"plateau over the last half: data dir {plateau_disk/1e6:.1f} MB, RSS {plateau_rss/1e6:.1f} MB")
print(f"slope over the last half: data dir {slope(1)/1e6:+.2f} MB/min, RSS {slope(2)*1024/1e6:+.2f} MB/min, "
      f"sled {slope(3)/1e6:+.2f} MB/min, value log {slope(4)/1e6:+.2f} MB/min")
print(f"sent {sent:.0f} ({sent / secs:.0f}/s); relay CPU: {ticks / 100:.1f} s, {ticks * 10_000 / sent:.0f} µs per send")
EOF
