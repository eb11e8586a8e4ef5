//go:build tools

// Package tools pins the promtool command built by scripts/go-tool-bin.sh. The
// build tag keeps this file out of every build; it exists so that `go mod tidy`
// keeps the modules (and go.sum entries) promtool's main package needs.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
