#!/usr/bin/env bash
# Build pinned Kubernetes control-plane binaries (kube-apiserver, kube-scheduler,
# kube-controller-manager, kubectl) and etcd from Go modules into a versioned
# cache, and reuse the cache when it is already there. Only Go is required.
#
# Usage:
#   scripts/k8s-bins.sh          build what is missing, print ONE directory holding
#                                all five binaries (symlinks into the caches below)
#   scripts/k8s-bins.sh k8s      ... print only the Kubernetes bin directory
#   scripts/k8s-bins.sh etcd     ... print only the etcd bin directory
#   scripts/k8s-bins.sh regen    regenerate tools/k8s-<minor>/ and tools/etcd/ go.mod + go.sum
#                                from the pinned versions below (after changing them); no build
#
# K8S_VERSION selects the Kubernetes release: unset for the default (the suite's), or one of the
# pinned minors below as `1.30` / `v1.30` / `v1.30.14` (the smoke on the oldest supported
# version, scripts/test-k8s-version.sh). etcd is the same for all of them.
#
# stdout carries only the directory path; all logs go to stderr.
#
# Cache layout (${VALKEY_SIDECAR_CACHE:-$HOME/.cache/valkey-sidecar}):
#   k8s-<K8S_VERSION>/bin/{kube-apiserver,kube-scheduler,kube-controller-manager,kubectl}
#   etcd-<ETCD_VERSION>/bin/etcd
#   k8s-<K8S_VERSION>-etcd-<ETCD_VERSION>/bin/   relative symlinks to all five
# Each directory is built under a temporary name and renamed into place in one
# step; it counts as valid only if its stamp file (written last) exists.
#
# Why wrapper modules: k8s.io/kubernetes and go.etcd.io/etcd/server/v3 replace
# their sibling modules with relative paths (./staging/..., ../api), so
# `go install pkg@version` refuses them. tools/k8s-<minor> and tools/etcd are tiny
# modules that require the release and replace every such sibling with its
# published version (k8s.io/<x> => k8s.io/<x> v0.<minor>.<patch>).
set -euo pipefail

# --- pinned versions ----------------------------------------------------------
# k8s.io/kubernetes per minor (supported range for this project: 1.30-1.37): the newest, which
# the whole suite runs on; the oldest supported, which the test command's smoke runs on; one
# between, for scripts/test-k8s-version.sh. Each has its wrapper module tools/k8s-<minor>/.
K8S_DEFAULT=1.37
declare -A K8S_PINS=([1.30]=v1.30.14 [1.33]=v1.33.13 [1.37]=v1.37.2)
ETCD_VERSION=v3.6.16    # go.etcd.io/etcd/server/v3
# ------------------------------------------------------------------------------

K8S_BINS=(kube-apiserver kube-scheduler kube-controller-manager kubectl)
ETCD_BINS=(etcd)
STAMP=.valkey-sidecar-complete

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE_ROOT=${VALKEY_SIDECAR_CACHE:-$HOME/.cache/valkey-sidecar}

log() { printf '[k8s-bins] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# K8S_VERSION: unset, `1.30`, `v1.30` or `v1.30.14` -> the pinned v1.30.14 (and its minor).
K8S_WANTED=${K8S_VERSION:-$K8S_DEFAULT}
K8S_WANTED=${K8S_WANTED#v}
K8S_MINOR_KEY=$(echo "$K8S_WANTED" | cut -d. -f1,2)
K8S_VERSION=${K8S_PINS[$K8S_MINOR_KEY]:-}
[[ -n $K8S_VERSION ]] || die "K8S_VERSION=$K8S_WANTED is not pinned here (pinned: ${!K8S_PINS[*]})"
[[ $K8S_WANTED == "$K8S_MINOR_KEY" || v$K8S_WANTED == "$K8S_VERSION" ]] ||
    die "K8S_VERSION=$K8S_WANTED: the pinned $K8S_MINOR_KEY release is $K8S_VERSION"
K8S_TOOLS=$REPO_ROOT/tools/k8s-$K8S_MINOR_KEY
ETCD_TOOLS=$REPO_ROOT/tools/etcd

# Reproducible, self-contained builds: static binaries (no C toolchain needed),
# no go.work from an enclosing directory, no VCS stamping of this repository.
export CGO_ENABLED=0 GOWORK=off GOFLAGS="${GOFLAGS:-} -buildvcs=false"

command -v go >/dev/null 2>&1 || die "go is not on PATH"

# v1.37.2 -> 37 / v0.37.2
k8s_minor() { local v=${K8S_VERSION#v}; v=${v#*.}; echo "${v%%.*}"; }
k8s_staging_version() { echo "v0.${K8S_VERSION#v1.}"; }

TMP_DIRS=()
cleanup() {
    local d
    for d in "${TMP_DIRS[@]+"${TMP_DIRS[@]}"}"; do rm -rf -- "$d"; done
}
# Builds run in the background so that a signal aborts them at once (bash defers
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

go_build() { # module-dir temp-dir go-build-args...
    local dir=$1 tmp=$2; shift 2
    mkdir -p "$tmp/gowork"
    (
        # go's own work dir goes under our temp dir, so an interrupted build
        # leaves nothing behind in /tmp.
        export GOTMPDIR=$tmp/gowork
        # Do not let go and its compilers inherit the lock: a killed run must not
        # keep it held through orphaned children.
        for fd in "${LOCK_FDS[@]+"${LOCK_FDS[@]}"}"; do exec {fd}>&-; done
        cd "$dir" && exec go build -mod=readonly -p 2 -trimpath "$@"
    ) >&2 &
    CHILD=$!
    wait "$CHILD"
    CHILD=
    rm -rf -- "$tmp/gowork"
}

# Serialise concurrent runs on one cache entry (best effort: flock is optional;
# correctness does not depend on it because the final rename refuses to clobber).
LOCK_FDS=()
lock() {
    mkdir -p "$CACHE_ROOT"
    if command -v flock >/dev/null 2>&1; then
        local fd
        exec {fd}>"$CACHE_ROOT/.lock-$1"
        LOCK_FDS+=("$fd")
        if ! flock -n "$fd"; then
            log "waiting for another build of $1 ..."
            flock "$fd"
        fi
    fi
}

valid() { # dir bin...
    local dir=$1 b; shift
    [[ -f $dir/$STAMP ]] || return 1
    for b in "$@"; do [[ -x $dir/bin/$b ]] || return 1; done
}

new_tmp() { # name
    mkdir -p "$CACHE_ROOT"
    # Remove leftovers of builds killed with SIGKILL long ago.
    find "$CACHE_ROOT" -maxdepth 1 -name '.tmp-*' -type d -mmin +720 -exec rm -rf {} + 2>/dev/null || true
    local t
    t=$(mktemp -d "$CACHE_ROOT/.tmp-$1.XXXXXX")
    echo "$t"
}

publish() { # tmpdir finaldir bin...
    local tmp=$1 final=$2; shift 2
    if [[ -e $final ]] && ! valid "$final" "$@"; then
        log "removing incomplete $final"
        rm -rf -- "$final"
    fi
    # mv -T renames the directory itself in one rename(2); it fails instead of
    # nesting if $final appeared meanwhile (then the other build wins).
    if ! mv -T -- "$tmp" "$final" 2>/dev/null; then
        valid "$final" "$@" || die "could not move $tmp to $final"
        log "$final was published concurrently; keeping it"
    fi
}

write_stamp() { # dir what
    {
        echo "what=$2"
        echo "go=$(go env GOVERSION) $(go env GOOS)/$(go env GOARCH)"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    } >"$1/$STAMP.tmp"
    chmod 755 "$1" # mktemp -d creates it 0700
    mv -- "$1/$STAMP.tmp" "$1/$STAMP"
}

require_pin() { # tooldir module version
    local have
    have=$(awk -v m="$2" '$1 == m && $2 ~ /^v/ {print $2; exit} $1 == "require" && $2 == m {print $3; exit}' "$1/go.mod")
    [[ $have == "$3" ]] || die "$1/go.mod requires $2 ${have:-<none>}, script pins $3; run: scripts/k8s-bins.sh regen"
}

module_time() { # tooldir module -> RFC3339 UTC release time from the module proxy
    (cd "$1" && go list -mod=readonly -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' "$2")
}

# --- Kubernetes ------------------------------------------------------------------
ensure_k8s() {
    local final=$CACHE_ROOT/k8s-$K8S_VERSION
    valid "$final" "${K8S_BINS[@]}" && return 0
    lock "k8s-$K8S_VERSION"
    valid "$final" "${K8S_BINS[@]}" && return 0
    require_pin "$K8S_TOOLS" k8s.io/kubernetes "$K8S_VERSION"

    local tmp date minor x ldflags=(-s -w) pkgs=() start=$SECONDS
    tmp=$(new_tmp "k8s-$K8S_VERSION")
    TMP_DIRS+=("$tmp")
    date=$(module_time "$K8S_TOOLS" k8s.io/kubernetes)
    [[ -n $date ]] || date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
    minor=$(k8s_minor)
    # Same variables as hack/lib/version.sh sets, for both version packages
    # (component-base: servers' /version and --version; client-go: kubectl).
    for x in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        ldflags+=(-X "$x.gitVersion=$K8S_VERSION" -X "$x.gitMajor=1" -X "$x.gitMinor=$minor"
            -X "$x.gitTreeState=clean" -X "$x.buildDate=$date")
    done
    for x in "${K8S_BINS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$x"); done

    log "building Kubernetes $K8S_VERSION (${K8S_BINS[*]}) into $final (takes minutes on a cold cache)"
    mkdir -p "$tmp/bin"
    go_build "$K8S_TOOLS" "$tmp" -ldflags "${ldflags[*]}" -o "$tmp/bin/" "${pkgs[@]}"
    "$tmp/bin/kube-apiserver" --version >&2
    write_stamp "$tmp" "k8s.io/kubernetes $K8S_VERSION"
    publish "$tmp" "$final" "${K8S_BINS[@]}"
    log "Kubernetes $K8S_VERSION ready after $((SECONDS - start))s"
}

# --- etcd ----------------------------------------------------------------------
ensure_etcd() {
    local final=$CACHE_ROOT/etcd-$ETCD_VERSION
    valid "$final" "${ETCD_BINS[@]}" && return 0
    lock "etcd-$ETCD_VERSION"
    valid "$final" "${ETCD_BINS[@]}" && return 0
    require_pin "$ETCD_TOOLS" go.etcd.io/etcd/server/v3 "$ETCD_VERSION"

    local tmp start=$SECONDS
    tmp=$(new_tmp "etcd-$ETCD_VERSION")
    TMP_DIRS+=("$tmp")
    # The version string itself is a constant in go.etcd.io/etcd/api/v3/version;
    # GitSHA is normally `git rev-parse --short HEAD` of the release checkout,
    # which a module build does not have, so record where the build came from.
    log "building etcd $ETCD_VERSION into $final"
    mkdir -p "$tmp/bin"
    go_build "$ETCD_TOOLS" "$tmp" -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-$ETCD_VERSION" \
        -o "$tmp/bin/etcd" go.etcd.io/etcd/server/v3
    "$tmp/bin/etcd" --version >&2
    write_stamp "$tmp" "go.etcd.io/etcd/server/v3 $ETCD_VERSION"
    publish "$tmp" "$final" "${ETCD_BINS[@]}"
    log "etcd $ETCD_VERSION ready after $((SECONDS - start))s"
}

# --- combined directory (what tests put on PATH / use as an assets dir) ----------
ensure_combined() {
    local final=$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION all=("${K8S_BINS[@]}" "${ETCD_BINS[@]}") b tmp
    valid "$final" "${all[@]}" && return 0
    lock "k8s-$K8S_VERSION-etcd-$ETCD_VERSION"
    valid "$final" "${all[@]}" && return 0
    tmp=$(new_tmp "k8s-$K8S_VERSION-etcd-$ETCD_VERSION")
    TMP_DIRS+=("$tmp")
    mkdir -p "$tmp/bin"
    for b in "${K8S_BINS[@]}"; do ln -s "../../k8s-$K8S_VERSION/bin/$b" "$tmp/bin/$b"; done
    for b in "${ETCD_BINS[@]}"; do ln -s "../../etcd-$ETCD_VERSION/bin/$b" "$tmp/bin/$b"; done
    write_stamp "$tmp" "links to k8s-$K8S_VERSION and etcd-$ETCD_VERSION"
    publish "$tmp" "$final" "${all[@]}"
}

# --- regen: rebuild the wrapper modules from the upstream go.mod -----------------
# Prints "module" for every module the upstream go.mod both requires and replaces
# with a relative path (./staging/src/k8s.io/api, ../api, ...).
relative_replaces() { # upstream-go.mod
    awk '
        /^require[ \t]*\(/ { inreq = 1; next }
        /^replace[ \t]*\(/ { inrep = 1; next }
        /^\)/              { inreq = 0; inrep = 0; next }
        /^require[ \t]/    { req[$2] = 1; next }
        inreq && NF >= 2   { req[$1] = 1; next }
        /^replace[ \t]/    { sub(/^replace[ \t]+/, "") }
        (inrep || /=>/) && /=>/ {
            split($0, side, "=>"); n = split(side[1], l, " "); split(side[2], r, " ")
            if (r[1] ~ /^\.\.?\//) rel[l[1]] = 1
        }
        END { for (m in rel) if (m in req) print m }
    ' "$1" | sort
}

regen_one() { # tooldir wrapper-module upstream-module version staging-version
    local dir=$1 name=$2 up=$3 ver=$4 sver=$5 gomod m goline dbg
    log "regenerating $dir from $up@$ver"
    mkdir -p "$dir"
    # A new minor's module imports the same commands as the default's.
    [[ -f $dir/tools.go ]] || cp "$REPO_ROOT/tools/k8s-$K8S_DEFAULT/tools.go" "$dir/tools.go"
    local scratch
    scratch=$(mktemp -d)
    TMP_DIRS+=("$scratch")
    gomod=$(cd "$scratch" && go mod download -json "$up@$ver" | awk -F'"' '$2 == "GoMod" {print $4}')
    [[ -f $gomod ]] || die "could not download $up@$ver"
    goline=$(awk '$1 == "go" {print $2; exit}' "$gomod")
    {
        echo "// Code generated by scripts/k8s-bins.sh regen from $up@$ver; DO NOT EDIT."
        echo "// Wrapper module: builds $up's commands without its relative replace directives."
        echo
        echo "module $name"
        echo
        echo "go $goline"
        echo
        # The main module's godebug settings apply to the binaries: keep upstream's.
        for dbg in $(awk '/^godebug[ \t]*\(/ {b = 1; next} b && /^\)/ {b = 0} b && NF {print $1} $1 == "godebug" && $2 != "(" {print $2}' "$gomod"); do
            echo "godebug $dbg"
            echo
        done
        echo "require $up $ver"
        echo
        echo "// Every module $up replaces with a relative path, pinned to its published release."
        echo "replace ("
        for m in $(relative_replaces "$gomod"); do printf '\t%s => %s %s\n' "$m" "$m" "$sver"; done
        echo ")"
    } >"$dir/go.mod"
    (
        cd "$dir"
        rm -f go.sum
        GOFLAGS=-mod=mod go mod tidy
    ) >&2
}

regen() {
    regen_one "$K8S_TOOLS" "valkey-sidecar/tools/k8s-$K8S_MINOR_KEY" k8s.io/kubernetes "$K8S_VERSION" "$(k8s_staging_version)"
    regen_one "$ETCD_TOOLS" valkey-sidecar/tools/etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" "$ETCD_VERSION"
    log "done; review and commit ${K8S_TOOLS#"$REPO_ROOT"/} and tools/etcd"
}

case ${1:-all} in
all | bin)
    ensure_etcd
    ensure_k8s
    ensure_combined
    echo "$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION/bin"
    ;;
k8s)
    ensure_k8s
    echo "$CACHE_ROOT/k8s-$K8S_VERSION/bin"
    ;;
etcd)
    ensure_etcd
    echo "$CACHE_ROOT/etcd-$ETCD_VERSION/bin"
    ;;
regen) regen ;;
-h | --help | help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2 ;;
*) die "unknown command '$1' (try --help)" ;;
esac
