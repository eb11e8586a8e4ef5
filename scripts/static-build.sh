#!/usr/bin/env bash
# Builds the static (musl) valkey-sidecar binary exactly as the Dockerfile's build stage does and
# prints its path. Logs go to stderr, the path to stdout. Idempotent and quick when done before.
#   - the rustup target x86_64-unknown-linux-musl (added when missing)
#   - Debian's musl-tools: x86_64-linux-musl-gcc, the C compiler the `cc` crate picks on its own
#     for this target to build ring's C and assembly (installed when missing)
# tests/image.rs runs this script and compares its cargo command with the Dockerfile's.
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=x86_64-unknown-linux-musl

if command -v rustup >/dev/null; then
  rustup target list --installed | grep -qx "$TARGET" || rustup target add "$TARGET" >&2
fi
if ! command -v x86_64-linux-musl-gcc >/dev/null; then
  echo "installing Debian package: musl-tools" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends musl-tools >&2
fi

# The build command: the same as the Dockerfile's `RUN cargo build ...` line (tests/image.rs).
cargo build --release --locked --target x86_64-unknown-linux-musl -p valkey-sidecar --bin valkey-sidecar >&2

# The target directory as cargo sees it (CARGO_TARGET_DIR or the workspace's `target/`).
dir=$(cargo metadata --format-version 1 --no-deps --locked | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin=$dir/$TARGET/release/valkey-sidecar
[[ -x $bin ]] || { echo "static-build: $bin was not built" >&2; exit 1; }
echo "$bin"
