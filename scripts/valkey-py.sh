#!/usr/bin/env bash
# Prints the path of a Python with valkey-py 6.2.0 (the Valkey project's Python client, the TLS
# tests' real cluster client), installing it into the cache first if needed: a virtualenv with the
# wheel pinned by sha256 in scripts/valkey-py-requirements.txt (pip --require-hashes, wheels only).
# Cached by that file's checksum. Logs go to stderr, the path to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=scripts/valkey-py-requirements.txt
sum=$(sha256sum "$requirements" | cut -c1-16)
cache=${VALKEY_SIDECAR_CACHE:-$HOME/.cache/valkey-sidecar}
dir=$cache/valkey-py-6.2.0-$sum
bin=$dir/bin/python

if [[ -x $bin && -f $dir/.complete ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
rm -rf "$dir"
echo "installing valkey-py 6.2.0 into $dir" >&2
python3 -m venv "$dir" >&2
"$bin" -m pip install --quiet --require-hashes --no-deps --only-binary=:all: -r "$requirements" >&2
"$bin" -c 'import valkey; print("valkey-py", valkey.__version__)' >&2
touch "$dir/.complete"
echo "$bin"
