//go:build tools

// Pins github.com/google/go-containerregistry v0.22.1 for scripts/go-tool-bin.sh.
package tools

import _ "github.com/google/go-containerregistry/cmd/crane"
