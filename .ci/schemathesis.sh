#!/usr/bin/env bash
# schemathesis (PyPI) against schemas/openapi.json and a live relay:
# generated and boundary/negative requests for every client operation, with
# a bounded number of examples each, with a valid session token (from
# examples/session_token.rs). Fails on any 5xx answer, any response
# that does not match the document (status, content type, schema), or a
# relay that dies during the run.
#
# Needs python3 (venv and pip, or at least pip) and network access to PyPI
# for the first install; everything goes under target/schemathesis/.
# Environment: SCHEMATHESIS_MAX_EXAMPLES (default 20), SCHEMATHESIS_SEED
# (default 1, so CI runs are reproducible), SCHEMATHESIS_EXTRA_ARGS (more
# `schemathesis run` options, word-split).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=4.32.5
BUILD="$PWD/target/schemathesis"
MAX_EXAMPLES="${SCHEMATHESIS_MAX_EXAMPLES:-20}"
SEED="${SCHEMATHESIS_SEED:-1}"
mkdir -p "$BUILD"

# ---- install (a venv; without venv/ensurepip, pip --target) ------------------------------
PY=python3
export PYTHONPATH="${PYTHONPATH:-}"
installed() { "$PY" -c "import schemathesis, sys; sys.exit(schemathesis.__version__ != '$VERSION')" 2>/dev/null; }
if [ -x "$BUILD/venv/bin/python" ] && PY="$BUILD/venv/bin/python" installed; then
    PY="$BUILD/venv/bin/python"
elif PYTHONPATH="$BUILD/site" installed; then
    export PYTHONPATH="$BUILD/site"
elif rm -rf "$BUILD/venv" && python3 -m venv "$BUILD/venv" >/dev/null 2>&1 && "$BUILD/venv/bin/python" -m pip --version >/dev/null 2>&1; then
    PY="$BUILD/venv/bin/python"
    echo "schemathesis: installing $VERSION into $BUILD/venv"
    "$PY" -m pip install --quiet --disable-pip-version-check "schemathesis==$VERSION"
else
    echo "schemathesis: python3 -m venv unavailable; installing $VERSION with pip --target $BUILD/site"
    rm -rf "$BUILD/venv" "$BUILD/site"
    python3 -m pip install --quiet --disable-pip-version-check --target "$BUILD/site" "schemathesis==$VERSION"
    export PYTHONPATH="$BUILD/site"
fi
installed || { echo "schemathesis: $VERSION did not install" >&2; exit 1; }

# ---- a relay on a free loopback port -----------------------------------------------------
cargo build --locked --quiet --bin relay
WORK="$(mktemp -d)"
RELAY_PID=
cleanup() {
    if [ -n "$RELAY_PID" ] && kill -0 "$RELAY_PID" 2>/dev/null; then
        kill "$RELAY_PID" 2>/dev/null || true
        wait "$RELAY_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
cat >"$WORK/relay.toml" <<EOF
[relay]
id = "relay-a"
public_url = "http://127.0.0.1:1"
listen = "127.0.0.1:0"
data_dir = "$WORK/data"
key_file = "$WORK/data/relay.key"

[limits]
anonymous_rate = 1000000
anonymous_burst = 1000000
EOF
RUST_LOG=warn target/debug/relay serve --config "$WORK/relay.toml" >"$WORK/stdout" 2>"$BUILD/relay.log" &
RELAY_PID=$!
URL=
for _ in $(seq 1 300); do
    URL="$(sed -n 's/^relay .* listening on \(http:\/\/127\.0\.0\.1:[0-9]*\)$/\1/p' "$WORK/stdout")"
    [ -n "$URL" ] && break
    kill -0 "$RELAY_PID" 2>/dev/null || { echo "schemathesis: relay exited at start" >&2; cat "$BUILD/relay.log" >&2; exit 1; }
    sleep 0.1
done
[ -n "$URL" ] || { echo "schemathesis: relay did not start within 30 s" >&2; exit 1; }
echo "schemathesis: relay at $URL"

# A session, so that the session methods get past authentication and parse
# their bodies (the account has one timeline record).
cargo build --locked --quiet --example session_token
TOKEN="$(target/debug/examples/session_token "$URL" relay-a)"

# ---- the run ----------------------------------------------------------------------------
# From inside the build directory: schemathesis keeps a cache in
# ./.schemathesis, which belongs there, not in the source tree.
status=0
SPEC="$PWD/schemas/openapi.json"
(cd "$BUILD" && "$PY" -m schemathesis.cli run "$SPEC" \
    --url "$URL" \
    --header "Authorization: Bearer $TOKEN" \
    --rate-limit 50/s \
    --checks not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance \
    --phases examples,coverage,fuzzing \
    --max-examples "$MAX_EXAMPLES" \
    --seed "$SEED" \
    --workers 1 \
    --request-timeout 30 \
    --generation-database none \
    --suppress-health-check all \
    --warnings off \
    --no-color \
    --report junit --report-dir "$BUILD/report" \
    ${SCHEMATHESIS_EXTRA_ARGS:-}) || status=$?

# The relay must have survived it all.
if ! kill -0 "$RELAY_PID" 2>/dev/null; then
    echo "schemathesis: the relay died during the run; its log: $BUILD/relay.log" >&2
    tail -n 50 "$BUILD/relay.log" >&2
    exit 1
fi
if ! "$PY" -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('$URL/healthz', timeout=10).status != 200)"; then
    echo "schemathesis: /healthz failed after the run" >&2
    exit 1
fi
if grep -q "panicked" "$BUILD/relay.log"; then
    echo "schemathesis: the relay logged a panic; see $BUILD/relay.log" >&2
    grep -m5 -A3 "panicked" "$BUILD/relay.log" >&2
    exit 1
fi
exit "$status"
