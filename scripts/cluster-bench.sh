#!/usr/bin/env bash
# Cluster mode's cost on this machine: `relay cluster up` (three
# nats-servers, R3) with NODES relay nodes, `relay bench` through node VIA's
# front, and the CPU each process spent per acknowledged send.
#
#   scripts/cluster-bench.sh [NODES] [VIA]      # defaults: 3 nodes, through node 1
#   MESSAGES=5000 CONCURRENCY=16 scripts/cluster-bench.sh 1
#   SHARDS=3 scripts/cluster-bench.sh 3          # accounts in 3 shards shared by the nodes
#   STANDALONE=1 scripts/cluster-bench.sh        # one `relay serve` on sled, the same bench and limits
#
# Needs the fastest build (cargo build --profile fastest; or RELAY=path) and nats-server (.ci/nats.sh).
# With one shard node 1 takes the lease first, so VIA=1 sends to the
# owner's front (which answers in process) and VIA=2 through a standby's
# (one more hop on loopback). TRAIL (8) seconds: how long after the bench the standbys'
# catch-up is counted (below). With several, every front routes each request to its
# account's shard, and most sends go from one shard's owner to another's.
set -euo pipefail
cd "$(dirname "$0")/.."
NODES="${1:-3}"
VIA="${2:-1}"
MESSAGES="${MESSAGES:-5000}"
CONCURRENCY="${CONCURRENCY:-16}"
SHARDS="${SHARDS:-1}"
STANDALONE="${STANDALONE:-0}"
RELAY="${RELAY:-target/fastest/relay}"
DIR="$(mktemp -d)"
# (errexit holds in the trap too: a relay already gone must not keep the dir)
trap 'kill -TERM "${UP:-}" 2>/dev/null || true; wait "${UP:-}" 2>/dev/null || true; rm -rf "$DIR"' EXIT

# The bench sends far faster than a person: lift the per-session and
# per-address limits of the nodes (every RELAY__ variable reaches them).
export RELAY__LIMITS__SESSION_RATE=1000000 RELAY__LIMITS__SESSION_BURST=1000000
export RELAY__LIMITS__ANONYMOUS_RATE=1000000 RELAY__LIMITS__ANONYMOUS_BURST=1000000
export RELAY__HTTP__MAX_CONNECTIONS_PER_IP=100000 RUST_LOG=warn,relay::cluster=info
pids() { pgrep -f "$1" | sort -n; }
if [ "$STANDALONE" = 1 ]; then
    # The standalone relay the cluster is compared with: the same build,
    # id and limits, its own sled store, no nats-server.
    NODES=1 VIA=1 SHARDS=0
    PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    printf '[relay]\nid = "relay-c"\npublic_url = "http://127.0.0.1:%s"\nlisten = "127.0.0.1:%s"\ndata_dir = "%s/data"\nkey_file = "%s/relay.key"\n' \
        "$PORT" "$PORT" "$DIR" "$DIR" > "$DIR/standalone.toml"
    "$RELAY" serve --config "$DIR/standalone.toml" > "$DIR/up.out" 2> "$DIR/up.err" &
    UP=$!
    for _ in $(seq 600); do [ -s "$DIR/up.out" ] && break; sleep 0.1; done
    URLS=("$(head -1 "$DIR/up.out" | awk '{print $NF}')")
    case "${URLS[0]}" in http://*) ;; *) cat "$DIR/up.err"; echo "relay did not come up" >&2; exit 1;; esac
    NODE_PIDS=("$UP") NATS_PIDS=()
else
    "$RELAY" cluster up --dir "$DIR" --base-port 0 --nodes "$NODES" --shards "$SHARDS" > "$DIR/up.out" 2> "$DIR/up.err" &
    UP=$!
    for _ in $(seq 600); do [ -s "$DIR/up.out" ] && break; sleep 0.1; done
    read -r -a WORDS < <(head -1 "$DIR/up.out") || true
    URLS=()
    for w in "${WORDS[@]}"; do case "$w" in http://*) URLS+=("$w");; esac; done
    [ "${#URLS[@]}" -eq "$NODES" ] || { cat "$DIR/up.err"; echo "cluster did not come up" >&2; exit 1; }
    # Several shards: let the nodes share them out (and hand some over) first.
    [ "$SHARDS" -eq 1 ] || sleep "${SETTLE:-10}"

    NODE_PIDS=(); for i in $(seq "$NODES"); do NODE_PIDS+=("$(pids "serve --config $DIR/node$i.toml")"); done
    NATS_PIDS=($(pids "nats-server -c $DIR/nats/"))
fi
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
snap() { for p in "${NODE_PIDS[@]}" "${NATS_PIDS[@]}"; do echo -n "$(ticks "$p") "; done; }
BEFORE=$(snap)

HANDED_BEFORE=$(grep -c "handed the shard over" "$DIR/up.err" || true)
"$RELAY" bench --relays "${URLS[$((VIA - 1))]}" --relay-ids relay-c \
    --messages "$MESSAGES" --concurrency "$CONCURRENCY" --json > "$DIR/bench.json"
AFTER=$(snap)
# Standbys' copies follow the log behind the owner (they lay what they
# read when nothing more is pending, or every INSTALL_BYTES) and catch up
# seconds after the bench: the CPU of the TRAIL seconds after it, less that
# of the TRAIL seconds after those (the idle rate: leases, records), is
# the bench's too.
TRAIL="${TRAIL:-8}"
sleep "$TRAIL"; TRAILED=$(snap)
sleep "$TRAIL"; IDLE=$(snap)

HANDED=$(( $(grep -c "handed the shard over" "$DIR/up.err" || true) - HANDED_BEFORE ))
python3 - "$DIR/bench.json" "$(getconf CLK_TCK)" "$NODES" "$VIA" "$SHARDS" "$HANDED" "$TRAIL" \
    "${#NODE_PIDS[@]}" "$BEFORE" "$AFTER" "$TRAILED" "$IDLE" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
hz, nodes, via, shards, handed, trail = float(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7]
n = int(sys.argv[8])
before, after, trailed, idle = ([int(t) for t in a.split()] for a in sys.argv[9:13])
sent = max(r["sent"], 1)
def us(ticks):
    return [round(t / hz * 1e6 / sent) for t in ticks]
during = [a - b for a, b in zip(after, before)]
late = [max(0, (t - a) - (i - t)) for a, t, i in zip(after, trailed, idle)]
setup = "standalone" if shards == "0" else f"nodes={nodes} shards={shards} via=node{via}"
print(f"{setup} sent={r['sent']} errors={r['errors']} send/s={r['send_per_sec']} "
      f"p50={r['send_p50_ms']}ms p99={r['send_p99_ms']}ms")
for what, ticks in (("during the bench", during), (f"with the catch-up in the {trail} s after it", [d + l for d, l in zip(during, late)])):
    relay, nats = us(ticks[:n]), us(ticks[n:])
    print(f"CPU µs per acknowledged send {what}: relay nodes {relay} (node1 first), nats-servers {nats}; "
          f"sums: relay {sum(relay)}, nats {sum(nats)}, total {sum(relay) + sum(nats)}")
print(f"of which after the bench (nodes, then nats-servers): {us(late)}; idle CPU µs per second: {us([(i - t) * sent / float(trail) for t, i in zip(trailed, idle)])}")
print(f"shards handed over during the bench: {handed}")
PY
