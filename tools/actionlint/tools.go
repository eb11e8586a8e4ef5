//go:build tools

// Pins github.com/rhysd/actionlint v1.7.12 for scripts/go-tool-bin.sh.
package tools

import _ "github.com/rhysd/actionlint/cmd/actionlint"
