#!/usr/bin/env bash
# Build a pinned helm from Go modules into a versioned cache, and reuse the cache
# when it is already there. Only Go is required.
#
# Usage:
#   scripts/helm-bin.sh          build helm if missing, print the absolute path of
#                                the helm binary
#   scripts/helm-bin.sh dir      ... print the directory holding it instead
#   scripts/helm-bin.sh regen    regenerate tools/helm/{go.mod,go.sum,tools.go} from
#                                the pinned version below (after changing it); no build
#
# stdout carries only the path; all logs go to stderr. Extra go build flags can be
# passed through GOFLAGS (e.g. GOFLAGS=-p=1 on a busy machine).
#
# Cache layout (${VALKEY_SIDECAR_CACHE:-$HOME/.cache/valkey-sidecar}):
#   helm-<HELM_VERSION>/bin/helm
# The directory is built under a temporary name and renamed into place in one
# step; it counts as valid only if its stamp file (written last) exists.
#
# Why a wrapper module: tools/helm is a tiny module that requires the helm release
# and imports its main package from a build-tagged tools.go, so that go.sum pins
# every module the build needs and `go build -mod=readonly` works offline once the
# module cache is filled. (helm's go.mod has no replace directives, so the
# wrapper needs none either.)
set -euo pipefail

# --- pinned version ------------------------------------------------------------
HELM_VERSION=v3.22.0    # helm.sh/helm/v3 (the major version selects the module path)
# -------------------------------------------------------------------------------

HELM_MAJOR=${HELM_VERSION%%.*}           # v3
HELM_MODULE=helm.sh/helm/$HELM_MAJOR     # helm.sh/helm/v3
STAMP=.valkey-sidecar-complete

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_ROOT=${VALKEY_SIDECAR_CACHE:-$HOME/.cache/valkey-sidecar}
HELM_TOOLS=$REPO_ROOT/tools/helm
FINAL=$CACHE_ROOT/helm-$HELM_VERSION

# Reproducible, self-contained builds: static binary (no C toolchain needed),
# no go.work from an enclosing directory, no VCS stamping of this repository.
export CGO_ENABLED=0 GOWORK=off GOFLAGS="${GOFLAGS:-} -buildvcs=false"

log() { printf '[helm-bin] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

command -v go >/dev/null 2>&1 || die "go is not on PATH"
case $CACHE_ROOT in /*) ;; *) CACHE_ROOT=$PWD/$CACHE_ROOT; FINAL=$CACHE_ROOT/helm-$HELM_VERSION ;; esac

TMP_DIRS=()
cleanup() {
    local d
    for d in "${TMP_DIRS[@]+"${TMP_DIRS[@]}"}"; do rm -rf -- "$d"; done
}
# The build runs in the background so that a signal aborts it at once (bash defers
# traps while a foreground child runs); the EXIT trap then drops the temp dir.
CHILD=
on_signal() {
    [[ -n $CHILD ]] && kill "$CHILD" 2>/dev/null
    exit "$1"
}
trap cleanup EXIT
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
trap 'on_signal 129' HUP

# Serialise concurrent runs on one cache entry (best effort: flock is optional;
# correctness does not depend on it because the final rename refuses to clobber).
LOCK_FD=
lock() {
    mkdir -p "$CACHE_ROOT"
    if command -v flock >/dev/null 2>&1; then
        exec {LOCK_FD}>"$CACHE_ROOT/.lock-helm-$HELM_VERSION"
        if ! flock -n "$LOCK_FD"; then
            log "waiting for another build of helm $HELM_VERSION ..."
            flock "$LOCK_FD"
        fi
    fi
}

valid() { # dir
    [[ -f $1/$STAMP && -x $1/bin/helm ]]
}

# Runs go in the background (see on_signal) with stdout sent to stderr.
run_go() { # dir go-args...
    local dir=$1; shift
    (
        # Do not let go and its compilers inherit the lock: a killed run must not
        # keep it held through orphaned children.
        [[ -n $LOCK_FD ]] && exec {LOCK_FD}>&-
        cd "$dir" && exec go "$@"
    ) >&2 &
    CHILD=$!
    wait "$CHILD"
    CHILD=
}

# Prints the version of module $2 selected by the wrapper module in $1 (or, with
# a third argument "time", its release time as RFC3339 UTC).
module_info() { # tooldir module [time]
    local fmt='{{.Version}}'
    [[ ${3:-} == time ]] && fmt='{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}'
    (cd "$1" && go list -mod=readonly -m -f "$fmt" "$2")
}

check_pin() {
    [[ -f $HELM_TOOLS/go.mod ]] || die "$HELM_TOOLS/go.mod is missing; run: scripts/helm-bin.sh regen"
    local have
    have=$(awk -v m="$HELM_MODULE" '$1 == m && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$HELM_TOOLS/go.mod")
    [[ $have == "$HELM_VERSION" ]] ||
        die "$HELM_TOOLS/go.mod requires $HELM_MODULE ${have:-<none>}, script pins $HELM_VERSION; run: scripts/helm-bin.sh regen"
}

ensure_helm() {
    valid "$FINAL" && return 0
    lock
    valid "$FINAL" && return 0
    check_pin

    local tmp cgo kmaj kmin ldflags start=$SECONDS
    mkdir -p "$CACHE_ROOT"
    # Remove leftovers of builds killed with SIGKILL long ago.
    find "$CACHE_ROOT" -maxdepth 1 -name '.tmp-helm-*' -type d -mmin +720 -exec rm -rf {} + 2>/dev/null || true
    tmp=$(mktemp -d "$CACHE_ROOT/.tmp-helm-$HELM_VERSION.XXXXXX")
    TMP_DIRS+=("$tmp")

    # What helm's Makefile sets for a tagged release: the version (otherwise
    # `helm version` says only "v3.22"), empty metadata (the default), a clean
    # tree (the module zip is the tagged tree, verified against go.sum), and the
    # default Kubernetes version for `helm template`/`helm lint`
    # (.Capabilities.KubeVersion), derived from the client-go release it links:
    # k8s.io/client-go v0.37.x -> 1.37 (without this helm falls back to 1.20).
    # gitCommit stays empty: a module build has no git checkout, and the module
    # proxy does not record the tag's commit.
    cgo=$(module_info "$HELM_TOOLS" k8s.io/client-go) || die "cannot resolve k8s.io/client-go in $HELM_TOOLS"
    cgo=${cgo#v}
    kmaj=$((${cgo%%.*} + 1))
    kmin=${cgo#*.}
    kmin=${kmin%%.*}
    ldflags="-s -w -X $HELM_MODULE/internal/version.version=$HELM_VERSION"
    ldflags+=" -X $HELM_MODULE/internal/version.gitTreeState=clean"
    local p
    for p in pkg/lint/rules pkg/chartutil; do
        # Both packages exist in helm v3; v4 moved them, so only set what exists.
        if (cd "$HELM_TOOLS" && go list -mod=readonly "$HELM_MODULE/$p" >/dev/null 2>&1); then
            ldflags+=" -X $HELM_MODULE/$p.k8sVersionMajor=$kmaj -X $HELM_MODULE/$p.k8sVersionMinor=$kmin"
        fi
    done

    log "building helm $HELM_VERSION into $FINAL (takes a few minutes on a cold Go cache)"
    mkdir -p "$tmp/bin" "$tmp/gowork"
    # go's own work dir goes under our temp dir, so an interrupted build leaves
    # nothing behind in /tmp.
    GOTMPDIR=$tmp/gowork run_go "$HELM_TOOLS" build -mod=readonly -trimpath \
        -ldflags "$ldflags" -o "$tmp/bin/helm" "$HELM_MODULE/cmd/helm"
    rm -rf -- "$tmp/gowork"

    local got
    got=$("$tmp/bin/helm" version --template '{{.Version}}') || die "built helm does not run"
    [[ $got == "$HELM_VERSION" ]] || die "built helm reports version '$got', expected $HELM_VERSION"
    "$tmp/bin/helm" version >&2

    {
        echo "what=$HELM_MODULE $HELM_VERSION"
        echo "kube-version-default=v$kmaj.$kmin.0 (k8s.io/client-go v$cgo)"
        echo "go=$(go env GOVERSION) $(go env GOOS)/$(go env GOARCH)"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    } >"$tmp/$STAMP.tmp"
    chmod 755 "$tmp" # mktemp -d creates it 0700
    mv -- "$tmp/$STAMP.tmp" "$tmp/$STAMP"

    if [[ -e $FINAL ]] && ! valid "$FINAL"; then
        log "removing incomplete $FINAL"
        rm -rf -- "$FINAL"
    fi
    # mv -T renames the directory itself in one rename(2); it fails instead of
    # nesting if $FINAL appeared meanwhile (then the other build wins).
    if ! mv -T -- "$tmp" "$FINAL" 2>/dev/null; then
        valid "$FINAL" || die "could not move $tmp to $FINAL"
        log "$FINAL was published concurrently; keeping it"
    fi
    log "helm $HELM_VERSION ready after $((SECONDS - start))s"
}

# --- regen: rewrite the wrapper module for the pinned version -------------------
regen() {
    local scratch gomod goline dbg
    log "regenerating $HELM_TOOLS from $HELM_MODULE@$HELM_VERSION"
    scratch=$(mktemp -d)
    TMP_DIRS+=("$scratch")
    gomod=$(cd "$scratch" && go mod download -json "$HELM_MODULE@$HELM_VERSION" | awk -F'"' '$2 == "GoMod" {print $4}')
    [[ -f $gomod ]] || die "could not download $HELM_MODULE@$HELM_VERSION"
    if grep -qE '^[[:space:]]*replace\b' "$gomod"; then
        log "warning: $HELM_MODULE@$HELM_VERSION has replace directives, which do not apply to"
        log "         a dependency; check them and pin them in $HELM_TOOLS/go.mod by hand"
    fi
    goline=$(awk '$1 == "go" {print $2; exit}' "$gomod")
    mkdir -p "$HELM_TOOLS"
    {
        echo "// Code generated by scripts/helm-bin.sh regen from $HELM_MODULE@$HELM_VERSION; DO NOT EDIT."
        echo "// Wrapper module: pins everything needed to build $HELM_MODULE/cmd/helm."
        echo
        echo "module valkey-sidecar/tools/helm"
        echo
        # The main module's go line sets the binary's default GODEBUG: keep upstream's.
        echo "go $goline"
        echo
        # ... as do its godebug settings.
        for dbg in $(awk '/^godebug[ \t]*\(/ {b = 1; next} b && /^\)/ {b = 0} b && NF {print $1} $1 == "godebug" && $2 != "(" {print $2}' "$gomod"); do
            echo "godebug $dbg"
            echo
        done
        echo "require $HELM_MODULE $HELM_VERSION"
    } >"$HELM_TOOLS/go.mod"
    cat >"$HELM_TOOLS/tools.go" <<EOF
// Code generated by scripts/helm-bin.sh regen; DO NOT EDIT.

//go:build tools

// Package tools pins the helm command built by scripts/helm-bin.sh. The build
// tag keeps this file out of every build; it exists so that \`go mod tidy\`
// keeps the modules (and go.sum entries) helm's main package needs.
package tools

import (
	_ "$HELM_MODULE/cmd/helm"
)
EOF
    rm -f "$HELM_TOOLS/go.sum"
    GOFLAGS=-mod=mod run_go "$HELM_TOOLS" mod tidy
    log "done; review and commit tools/helm"
}

case ${1:-bin} in
bin | path)
    ensure_helm
    echo "$FINAL/bin/helm"
    ;;
dir)
    ensure_helm
    echo "$FINAL/bin"
    ;;
regen) regen ;;
-h | --help | help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2 ;;
*) die "unknown command '$1' (try --help)" ;;
esac
