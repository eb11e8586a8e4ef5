#!/usr/bin/env bash
# The MSRV check: builds every crate and target of the workspace with the oldest Rust that
# Cargo.toml claims (`rust-version`), so the claim cannot fall behind a dependency or a language
# feature unnoticed. rustup installs that toolchain (minimal) on first use; it builds in a target
# directory of its own, beside the usual one.
set -euo pipefail
cd "$(dirname "$0")/.."
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
if [[ -z $msrv ]]; then
  echo "msrv: no rust-version in Cargo.toml" >&2
  exit 1
fi
rustup toolchain install "$msrv" --profile minimal --no-self-update >&2
target="${CARGO_TARGET_DIR:-$HOME/.cache/valkey-sidecar/target}-msrv"
CARGO_TARGET_DIR="$target" cargo "+$msrv" check --workspace --all-targets --locked
echo "msrv: the workspace builds with Rust $msrv" >&2
