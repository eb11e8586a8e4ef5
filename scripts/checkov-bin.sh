#!/usr/bin/env bash
# Prints the path of checkov 3.3.30 (the scanner platform teams gate charts on), installing it into
# the cache first if needed: a virtualenv with every package pinned by sha256 in
# scripts/checkov-requirements.txt (pip --require-hashes, wheels only, no resolver). Cached by that
# file's checksum, so a change to the pins installs afresh. Logs go to stderr, the path to stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=scripts/checkov-requirements.txt
sum=$(sha256sum "$requirements" | cut -c1-16)
cache=${VALKEY_SIDECAR_CACHE:-$HOME/.cache/valkey-sidecar}
dir=$cache/checkov-3.3.30-$sum
bin=$dir/bin/checkov

if [[ -x $bin && -f $dir/.complete ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/.checkov-XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "installing checkov 3.3.30 into $dir" >&2
python3 -m venv "$work" >&2
"$work/bin/python" -m pip install --quiet --require-hashes --no-deps --only-binary=:all: \
  -r "$requirements" >&2
# A virtualenv's scripts name its directory: build it where it will live.
rm -rf "$dir"
mv "$work" "$dir"
trap - EXIT
python3 -m venv --upgrade "$dir" >&2
sed -i "1s|^#!.*python.*$|#!$dir/bin/python|" "$dir/bin/checkov"
"$bin" --version >&2
touch "$dir/.complete"
echo "$bin"
