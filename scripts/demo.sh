#!/usr/bin/env bash
# The demo (README's first command): a real Kubernetes control plane (etcd + kube-apiserver +
# kube-scheduler + kube-controller-manager v1.37.2), six fake nodes in three zones, and a Valkey
# Cluster of 3 shards x (1 primary + 1 replica) as process-backed pods with the valkey-sidecar agent
# beside each Valkey. Prints a live pod table every 2 s and how to point kubectl at it; Ctrl-C tears
# everything down.
#
#   scripts/demo.sh               run until Ctrl-C
#   scripts/demo.sh --seconds 60  run for a minute
#   scripts/demo.sh --once        print the table once everything is Ready, then exit
#
# First run on a fresh machine: installs valkey-server and Debian packages, and builds the
# Kubernetes binaries from Go modules (many minutes, cached in ~/.cache/valkey-sidecar).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
VALKEY_TESTKIT_K8S_BIN_DIR="$(scripts/k8s-bins.sh)"
VALKEY_SERVER="$(scripts/valkey-bin.sh)"
export VALKEY_TESTKIT_K8S_BIN_DIR VALKEY_SERVER
cargo build --bin valkey-sidecar -p valkey-sidecar
cargo build --bin demo -p valkey-sidecar-bench
target_dir="${CARGO_TARGET_DIR:-$PWD/target}"
export VALKEY_SIDECAR_BIN="$target_dir/debug/valkey-sidecar"
exec "$target_dir/debug/demo" "$@"
