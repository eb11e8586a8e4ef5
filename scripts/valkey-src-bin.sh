#!/usr/bin/env bash
# Prints the path of a TLS-capable valkey-server 8.0.1 built from the vendored source
# (../shared/vendor/valkey-8.0.1-src.tar.gz, checksum verified first), building it into the cache
# first if needed (~3 min on 2 cores; needs build-essential, pkg-config, libssl-dev). The cache is
# keyed by the tarball's checksum. Logs go to stderr, the path to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
vendor=${VALKEY_SIDECAR_VENDOR:-../shared/vendor}
tarball=$vendor/valkey-8.0.1-src.tar.gz
sha=$(grep ' valkey-8.0.1-src.tar.gz$' "$vendor/SHA256SUMS" | cut -d' ' -f1)
cache=${VALKEY_SIDECAR_CACHE:-$HOME/.cache/valkey-sidecar}
dir=$cache/valkey-8.0.1-tls-${sha:0:16}
bin=$dir/bin/valkey-server
if [[ -x $bin && -f $dir/.complete ]]; then
  echo "$bin"
  exit 0
fi
echo "$sha  $tarball" | sha256sum --check --quiet >&2
need=()
command -v make >/dev/null || need+=(build-essential)
command -v pkg-config >/dev/null || need+=(pkg-config)
dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
if ((${#need[@]})); then
  echo "installing Debian packages: ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi
mkdir -p "$cache"
work=$(mktemp -d "$cache/.valkey-8.0.1-XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "building valkey-server 8.0.1 (TLS) from $tarball" >&2
tar xzf "$tarball" -C "$work"
# One make in src/ for both binaries: the top-level Makefile runs a sub-make per target, and with
# -j2 the two raced on the shared deps (one cleaned hiredis while the other archived it; a cold CI
# run failed so on 2026-12-07).
make -C "$work/valkey-8.0.1/src" -j2 BUILD_TLS=yes MALLOC=libc valkey-server valkey-cli >&2
mkdir -p "$work/bin"
cp "$work/valkey-8.0.1/src/valkey-server" "$work/valkey-8.0.1/src/valkey-cli" "$work/bin/"
rm -rf "$work/valkey-8.0.1"
"$work/bin/valkey-server" --version >&2
touch "$work/.complete"
rm -rf "$dir"
mv "$work" "$dir"
trap - EXIT
echo "$bin"
