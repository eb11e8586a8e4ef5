#!/usr/bin/env bash
# Builds a pinned Go tool from its module into a versioned cache and prints the binary's path
# (logs to stderr). Only Go is needed; the wrapper module tools/<tool>/ pins every module of the
# build in its go.sum, so `go build -mod=readonly` checks each download against it.
#
#   scripts/go-tool-bin.sh <tool>          build if missing, print the path
#   scripts/go-tool-bin.sh <tool> regen    rewrite tools/<tool>/ for the pinned version (no build)
#
# Tools: crane (OCI images and a registry: scripts/release.sh, tests/k8s_release.rs),
#        actionlint (the GitHub workflows: tests/workflows.rs),
#        promtool (Prometheus' rule checker: the alert rules' unit tests, tests/monitoring.rs;
#        its release's version string set as Prometheus' release build does: v0.316.0 is 3.16.0).
# Cache: ${VALKEY_SIDECAR_CACHE:-~/.cache/valkey-sidecar}/<tool>-<version>/bin/<tool>, valid once
# its stamp exists (written last; the directory is renamed into place in one step).
set -euo pipefail

tool=${1:?usage: scripts/go-tool-bin.sh <crane|actionlint|promtool> [regen]}
ldflags=
case $tool in
  crane) module=github.com/google/go-containerregistry version=v0.22.1 pkg=cmd/crane ;;
  actionlint) module=github.com/rhysd/actionlint version=v1.7.12 pkg=cmd/actionlint ;;
  promtool)
    module=github.com/prometheus/prometheus version=v0.316.0 pkg=cmd/promtool
    ldflags="-X github.com/prometheus/common/version.Version=3.16.0 -X github.com/prometheus/common/version.Branch=HEAD"
    ;;
  *) echo "go-tool-bin: unknown tool $tool" >&2; exit 64 ;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
wrapper=$root/tools/$tool
cache=${VALKEY_SIDECAR_CACHE:-$HOME/.cache/valkey-sidecar}
final=$cache/$tool-$version
stamp=.valkey-sidecar-complete
# Static, self-contained, no go.work from above, no VCS stamping of this repository.
export CGO_ENABLED=0 GOWORK=off GOFLAGS="${GOFLAGS:-} -buildvcs=false"

regen() {
  rm -rf "$wrapper" && mkdir -p "$wrapper"
  printf '//go:build tools\n\n// Pins %s %s for scripts/go-tool-bin.sh.\npackage tools\n\nimport _ "%s/%s"\n' \
    "$module" "$version" "$module" "$pkg" >"$wrapper/tools.go"
  (cd "$wrapper" && go mod init "valkey-sidecar.local/tools/$tool" >&2 &&
    go get "$module@$version" >&2 && go mod tidy >&2)
}

build() {
  mkdir -p "$cache"
  local tmp
  tmp=$(mktemp -d "$cache/.tmp-$tool-$version.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  grep -q "$module $version" "$wrapper/go.mod" ||
    { echo "go-tool-bin: $wrapper/go.mod does not pin $module $version; run: $0 $tool regen" >&2; exit 1; }
  echo "go-tool-bin: building $tool $version (cold Go caches: crane, actionlint ~1 min; promtool ~5)" >&2
  (cd "$wrapper" && go build -mod=readonly -trimpath -ldflags "-s -w $ldflags" -o "$tmp/bin/$tool" "$module/$pkg") >&2
  echo "$module $version, $(go env GOVERSION), built $(date -u +%FT%TZ)" >"$tmp/$stamp"
  chmod 755 "$tmp"
  rm -rf "$final"
  mv -T "$tmp" "$final"
  trap - EXIT
}

if [[ ${2:-} == regen ]]; then regen; exit 0; fi
[[ -f $final/$stamp && -x $final/bin/$tool ]] || build
echo "$final/bin/$tool"
