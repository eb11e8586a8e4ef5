#!/usr/bin/env bash
# The test command (README): installs what the tests need, then runs every test of the workspace
# against real valkey-server processes on loopback (and the Kubernetes-level ones against a real
# control plane), with cargo-nextest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# The arm64 node pools' binary, same commit (zig from PyPI; tests/release.rs runs it under qemu),
# built while everything below runs (in a target directory of its own, scripts/static-build.sh),
# since the two release builds' last steps (LTO into one codegen unit) each keep a single core busy
# for minutes.
aarch64_out=$(mktemp)
trap 'rm -f "$aarch64_out"' EXIT
scripts/static-build.sh aarch64 >"$aarch64_out" &
aarch64_build=$!
# Assigned before exported: `export X="$(cmd)"` hides a failing build from `set -e` (a cold run
# went on without its TLS Valkey, and its TLS tests failed on an empty path).
VALKEY_SERVER="$(scripts/valkey-bin.sh)"
export VALKEY_SERVER
# The older Valkeys the upgrade tests roll from (tests/k8s_rollout.rs): 9.0.0 from PyPI, 8.0.1 built
# with TLS from ../shared/vendor (~3 min once, cached by the tarball's checksum).
VALKEY_SERVER_9_0_0="$(VALKEY_VERSION=9.0.0 scripts/valkey-bin.sh)"
export VALKEY_SERVER_9_0_0
VALKEY_SERVER_8_0_1="$(scripts/valkey-src-bin.sh)"
export VALKEY_SERVER_8_0_1
VALKEY_TESTKIT_K8S_BIN_DIR="$(scripts/k8s-bins.sh)"
export VALKEY_TESTKIT_K8S_BIN_DIR
# The oldest supported Kubernetes, for the install smoke (tests/k8s_install.rs).
VALKEY_TESTKIT_K8S_BIN_DIR_1_30="$(K8S_VERSION=1.30 scripts/k8s-bins.sh)"
export VALKEY_TESTKIT_K8S_BIN_DIR_1_30
HELM_BIN="$(scripts/helm-bin.sh)"
export HELM_BIN
PROMTOOL_BIN="$(scripts/go-tool-bin.sh promtool)"
export PROMTOOL_BIN
# Every pod the Kubernetes-level tests run gets the image's binary (static, musl, release: the
# Dockerfile's build), as users do and as the benchmark's figures do (the fault log records the
# build of each scenario).
VALKEY_SIDECAR_BIN="$(scripts/static-build.sh)"
export VALKEY_SIDECAR_BIN
CRANE_BIN="$(scripts/go-tool-bin.sh crane)"
export CRANE_BIN
ACTIONLINT_BIN="$(scripts/go-tool-bin.sh actionlint)"
export ACTIONLINT_BIN
CHECKOV_BIN="$(scripts/checkov-bin.sh)"
export CHECKOV_BIN
# The TLS tests' real cluster client (valkey-py, pinned by hash; tests/k8s_tls.rs).
VALKEY_PY="$(scripts/valkey-py.sh)"
export VALKEY_PY
# Licenses, bans and sources of every dependency (deny.toml), offline once the crates are fetched.
cargo fetch --locked
"$(scripts/cargo-deny-bin.sh)" --offline check licenses bans sources
# Known vulnerabilities, against the RustSec snapshot in ../shared/vendor (no network needed).
scripts/advisories.sh --offline
wait "$aarch64_build"
VALKEY_SIDECAR_BIN_AARCH64="$(cat "$aarch64_out")"
export VALKEY_SIDECAR_BIN_AARCH64
# Every test of the workspace from one queue on the machine's cores (.config/nextest.toml: why,
# and which tests run alone), every failure reported; then the documentation's examples, which
# nextest does not run.
"$(scripts/nextest-bin.sh)" nextest run --workspace --locked "$@"
cargo test --doc --workspace --locked
