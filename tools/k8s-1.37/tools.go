//go:build tools

// Package tools pins the Kubernetes control-plane commands built by
// scripts/k8s-bins.sh. The build tag keeps this file out of every build;
// it exists so that `go mod tidy` keeps the modules (and go.sum entries)
// these main packages need.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
