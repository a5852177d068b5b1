#!/usr/bin/env bash
# Issue 40's size targets on this machine: one shard on `relay cluster up`
# (three nats-servers R3, three relay nodes), SENDS sends of PAYLOAD bytes
# of ciphertext through the owner's front, in rounds of ROUND.
#
#   scripts/cluster-scale.sh [SENDS] [FIRST]    # defaults: 1000000, 10000
#   ROUND=250000 PAYLOAD=1024 CONCURRENCY=16 scripts/cluster-scale.sh
#
# What it prints, per phase:
# - each node's peak RSS, sampled once a second (the owner is the node
#   that took the lease last in up.err);
# - sends slower than 100 ms and the slowest (a commit that stalls the
#   shard shows as sends that wait for it);
# - a takeover, after FIRST sends and again after SENDS: a steady
#   `relay bench --rate 20` through a node that is not the owner, the
#   owner killed (`kill -9`) while it runs. The bench counts each send's
#   latency from its intended time (open loop), so its slowest send is the
#   longest wait for an acknowledgement across the takeover; errors are
#   sends refused or lost on the way.
#
# Needs the release build (or RELAY=path) and nats-server (.ci/nats.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
SENDS="${1:-1000000}"
FIRST="${2:-10000}"
ROUND="${ROUND:-250000}"
PAYLOAD="${PAYLOAD:-1024}"
CONCURRENCY="${CONCURRENCY:-16}"
RELAY="${RELAY:-target/release/relay}"
DIR="$(mktemp -d)"
trap 'kill "$SAMPLER" 2>/dev/null; kill -TERM "$UP" 2>/dev/null; wait "$UP" 2>/dev/null; rm -rf "$DIR"' EXIT
SAMPLER=

export RELAY__LIMITS__SESSION_RATE=1000000 RELAY__LIMITS__SESSION_BURST=1000000
export RELAY__LIMITS__ANONYMOUS_RATE=1000000 RELAY__LIMITS__ANONYMOUS_BURST=1000000
export RELAY__HTTP__MAX_CONNECTIONS_PER_IP=100000 RUST_LOG=warn,relay::cluster=info
"$RELAY" cluster up --dir "$DIR" --base-port 0 --nodes 3 --shards 1 > "$DIR/up.out" 2> "$DIR/up.err" &
UP=$!
for _ in $(seq 600); do [ -s "$DIR/up.out" ] && break; sleep 0.1; done
read -r -a WORDS < <(head -1 "$DIR/up.out")
URLS=()
for w in "${WORDS[@]}"; do case "$w" in http://*) URLS+=("$w");; esac; done
[ "${#URLS[@]}" -eq 3 ] || { cat "$DIR/up.err"; echo "cluster did not come up" >&2; exit 1; }

node_pid() { pgrep -f "serve --config $DIR/node$1.toml" | head -1; }
# The node (1-3) that took the shard's lease last.
owner() {
  for _ in $(seq 300); do
    local n
    n=$(grep -o 'took the lease.*node=node[0-9]' "$DIR/up.err" | tail -1 | grep -o '[0-9]$' || true)
    [ -n "$n" ] && { echo "$n"; return; }
    sleep 0.1
  done
  echo "no owner" >&2; exit 1
}
# One line a second: seconds since start, then each node's RSS in KiB.
(
  start=$(date +%s)
  while true; do
    line="$(( $(date +%s) - start ))"
    for i in 1 2 3; do
      p=$(node_pid "$i" || true)
      line="$line $( [ -n "$p" ] && ps -o rss= -p "$p" 2>/dev/null | tr -d ' ' || echo 0)"
    done
    echo "$line" >> "$DIR/rss"
    sleep 1
  done
) &
SAMPLER=$!
MARK=0
phase_rss() { # peak RSS (MiB) of each node since the last mark
  python3 - "$DIR/rss" "$MARK" <<'PY'
import sys
rows = [list(map(int, l.split())) for l in open(sys.argv[1]) if len(l.split()) == 4]
rows = [r for r in rows if r[0] >= int(sys.argv[2])]
print(" ".join(f"node{i}={max((r[i] for r in rows), default=0) / 1024:.0f}MiB" for i in (1, 2, 3)))
PY
  MARK=$(tail -1 "$DIR/rss" | cut -d' ' -f1)
}
slow() { # sends over 100 ms, the slowest, errors, rate of a bench report
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
over = sum(n for low, n in r["send_histogram_us"] if low >= 100_000)
print(f"sent={r['sent']} errors={r['errors']} send/s={r['send_per_sec']} p50={r['send_p50_ms']}ms "
      f"p99={r['send_p99_ms']}ms max={r['send_max_ms']}ms sends_over_100ms={over}")
PY
}
streams() { # MiB on disk: nats-server n1's streams, each node's copies
  for d in "$DIR"/nats/n1/jetstream/*/*/streams/* "$DIR"/node*/shards; do
    [ -d "$d" ] && echo -n "$(basename "$(dirname "$d")")/$(basename "$d")=$(du -sm "$d" | cut -f1) "
  done
}
load() { # $1 sends through the owner's front
  local n=$1 o
  o=$(owner)
  "$RELAY" bench --relays "${URLS[$((o - 1))]}" --relay-ids relay-c --payload "$PAYLOAD" \
      --messages "$n" --concurrency "$CONCURRENCY" --json > "$DIR/load.json"
  echo "load of $n via node$o: $(slow "$DIR/load.json")"
}
takeover() {
  local o via pid
  o=$(owner)
  via=$(( o % 3 + 1 ))
  "$RELAY" bench --relays "${URLS[$((via - 1))]}" --relay-ids relay-c --payload "$PAYLOAD" \
      --messages 600 --rate 20 --concurrency 4 --duration 30s --json > "$DIR/takeover.json" 2> "$DIR/takeover.err" &
  local bench=$!
  sleep 10
  pid=$(node_pid "$o")
  kill -9 "$pid"
  # A send in flight at the owner when it died has no answer: the bench
  # counts it as an error (a client retries it; the protocol makes that safe).
  wait "$bench" || true
  local next
  for _ in $(seq 100); do
    next=$(grep -c 'took the lease' "$DIR/up.err")
    [ "$(owner)" != "$o" ] && break
    sleep 0.1
  done
  echo "takeover after kill -9 of node$o (bench via node$via, 20 sends/s): $(slow "$DIR/takeover.json")"
  echo "  node$(owner) took the lease ($next leases taken so far); the bench's errors:"
  grep -v '^\s*$' "$DIR/takeover.err" | sort | uniq -c | sort -rn | head -5 | sed 's/^/    /' || true
}

echo "phase 1: $FIRST sends"
load "$FIRST"
echo "  peak RSS: $(phase_rss)"
takeover
echo "  peak RSS: $(phase_rss)"
done_sends=$FIRST
while [ "$done_sends" -lt "$SENDS" ]; do
  n=$(( SENDS - done_sends < ROUND ? SENDS - done_sends : ROUND ))
  load "$n"
  done_sends=$(( done_sends + n ))
  echo "  after $done_sends sends, peak RSS: $(phase_rss); data: $(du -sm "$DIR" | cut -f1) MiB"
  echo "  on disk (MiB): $(streams)"
done
takeover
echo "  peak RSS: $(phase_rss)"
