#!/usr/bin/env bash
# Builds the static (musl) valkey-sidecar binary for one architecture and prints its path. Logs go
# to stderr, the path to stdout. Idempotent and quick when done before.
#   scripts/static-build.sh            x86_64: exactly the Dockerfile's build stage
#   scripts/static-build.sh aarch64    arm64 node pools: the same sources through cargo-zigbuild
# x86_64 needs the rustup target x86_64-unknown-linux-musl and Debian's musl-tools
# (x86_64-linux-musl-gcc, the C compiler the `cc` crate picks on its own for ring's C and
# assembly). aarch64 needs the rustup target aarch64-unknown-linux-musl and zig, which cross-compiles
# ring and links: pinned wheels of `ziglang` and `cargo-zigbuild` from PyPI, checked by sha256,
# in a virtualenv under the cache. Everything missing is installed.
# The binary records the commit it was built from (`valkey_sidecar_build_info`, `--version`).
# tests/image.rs runs this script and compares its x86_64 cargo command with the Dockerfile's.
set -euo pipefail
cd "$(dirname "$0")/.."

arch=${1:-x86_64}
case $arch in
  x86_64 | aarch64) TARGET=$arch-unknown-linux-musl ;;
  *) echo "static-build: unknown architecture $arch (x86_64 or aarch64)" >&2; exit 64 ;;
esac

# The commit, `-dirty` when the tree has changes: a binary never claims a commit it is not.
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[[ $revision == unknown || -z $(git status --porcelain --untracked-files=no 2>/dev/null) ]] ||
  revision+=-dirty
export VALKEY_SIDECAR_REVISION=$revision

if command -v rustup >/dev/null; then
  rustup target list --installed | grep -qx "$TARGET" || rustup target add "$TARGET" >&2
fi

# The pinned zig toolchain (PyPI wheels); prints the directory to put first on PATH.
zig_toolchain() {
  local cache=${VALKEY_SIDECAR_CACHE:-$HOME/.cache/valkey-sidecar}
  local dir=$cache/zigbuild-0.24.0-zig-0.17.0
  if [[ ! -f $dir/.complete ]]; then
    echo "installing zig 0.17.0 and cargo-zigbuild 0.24.0 (PyPI wheels)" >&2
    local work
    mkdir -p "$cache"
    work=$(mktemp -d "$cache/.zigbuild-XXXXXX")
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$work/wheels" \
      ziglang==0.17.0 cargo-zigbuild==0.24.0 >&2
    (cd "$work/wheels" && sha256sum --check --quiet >&2) <<'SUMS'
97079827064a7492cce5541ceb438ae8003ce1e54e399676da2d62fb7a5dc08b  ziglang-0.17.0-py3-none-manylinux_2_12_x86_64.manylinux2010_x86_64.musllinux_1_1_x86_64.whl
484412e39e4c6039474535ce97ee75a22bab22d58233056f8ec8a8f9034bb957  cargo_zigbuild-0.24.0-py3-none-manylinux_2_5_x86_64.manylinux1_x86_64.whl
SUMS
    python3 -m venv "$work/venv" >&2
    "$work/venv/bin/pip" install --quiet --no-deps --no-index "$work"/wheels/*.whl >&2
    # cargo-zigbuild looks for `zig` on PATH first.
    ln -s "$("$work/venv/bin/python3" -c 'import ziglang, os; print(os.path.dirname(ziglang.__file__))')/zig" \
      "$work/venv/bin/zig"
    rm -rf "$work/wheels" "$dir"
    touch "$work/.complete"
    mv -T "$work" "$dir"
  fi
  echo "$dir/venv/bin"
}

if [[ $arch == x86_64 ]]; then
  if ! command -v x86_64-linux-musl-gcc >/dev/null; then
    echo "installing Debian package: musl-tools" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends musl-tools >&2
  fi
  # The build command: the same as the Dockerfile's `RUN cargo build ...` line (tests/image.rs
  # finds it by its start, hence unindented).
cargo build --release --locked --target x86_64-unknown-linux-musl -p valkey-sidecar --bin valkey-sidecar >&2
else
  PATH=$(zig_toolchain):$PATH
  # A target directory of its own: cargo builds in one directory one at a time, so this build can
  # run beside the x86_64 one (scripts/test.sh does), and a later call (scripts/release.sh, run by
  # tests/k8s_release.rs) finds it done instead of building it again in the shared directory.
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}-aarch64"
  # Rust's aarch64 musl target links a static non-PIE executable: no run-time relocations at all,
  # so there is nothing to pack (x86_64's static-pie packs its table, .cargo/config.toml).
  cargo zigbuild --release --locked --target "$TARGET" -p valkey-sidecar --bin valkey-sidecar >&2
fi

# The target directory as cargo sees it (CARGO_TARGET_DIR or the workspace's `target/`).
dir=$(cargo metadata --format-version 1 --no-deps --locked | sed -n 's/.*"target_directory":"\([^"]*\)".*/\1/p')
bin=$dir/$TARGET/release/valkey-sidecar
[[ -x $bin ]] || { echo "static-build: $bin was not built" >&2; exit 1; }
echo "$bin"
