//go:build tools

// Package tools pins the etcd server built by scripts/k8s-bins.sh. The build
// tag keeps this file out of every build; it exists so that `go mod tidy`
// keeps the modules (and go.sum entries) the etcd main package needs.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
