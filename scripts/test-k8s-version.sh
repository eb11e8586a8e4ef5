#!/usr/bin/env bash
# Runs the whole test suite on another pinned Kubernetes minor: the control plane of every
# Kubernetes-level test (kube-apiserver, scheduler, controller-manager, kubectl) is that release,
# built from Go modules like the default (scripts/k8s-bins.sh; cached by version).
#   scripts/test-k8s-version.sh 1.33            every test
#   scripts/test-k8s-version.sh 1.30 --test k8s_chart    one test file (cargo test arguments)
# Pinned minors: 1.30 (the oldest supported), 1.33, 1.37 (the default). The suite asserts what the
# chart renders for the API it finds (discovery), so the same tests hold on each.
set -euo pipefail
cd "$(dirname "$0")/.."
minor=${1:?usage: scripts/test-k8s-version.sh <minor, e.g. 1.33> [cargo test arguments]}
shift
# scripts/test.sh takes the default control plane from scripts/k8s-bins.sh, which builds (or finds)
# the release K8S_VERSION names: every test that starts a control plane gets that one.
export K8S_VERSION="$minor"
echo "test-k8s-version: the suite on Kubernetes $K8S_VERSION" >&2
exec scripts/test.sh "$@"
