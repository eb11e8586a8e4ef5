#!/usr/bin/env bash
# A local Kubernetes for experiments: etcd + kube-apiserver + kube-scheduler + kube-controller-manager
# (v1.37.2, built from Go modules), six fake nodes over three zones, and the process kubelet that runs
# pods' valkey and valkey-sidecar containers as local processes. Prints the KUBECONFIG to use;
# Ctrl-C tears everything down. `--seconds N` stops after N seconds.
set -euo pipefail
exec "$(dirname "$0")/demo.sh" --plane-only "$@"
