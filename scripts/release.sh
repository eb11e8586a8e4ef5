#!/usr/bin/env bash
# Publishes one release to an OCI registry, without a Docker daemon:
#   scripts/release.sh <registry>/<namespace>
# pushes
#   <registry>/<namespace>/valkey-sidecar:<version>        an image index: linux/amd64 + linux/arm64
#   <registry>/<namespace>/valkey-sidecar:<version>-amd64  and -arm64, one image per platform
#   oci://<registry>/<namespace>/charts/valkey-sidecar     the chart at <version>, whose default
#                                                          agent image is the index above
# <version> is the crate's (the chart's version and appVersion are set to it). Each image is the
# Dockerfile's final stage: the static binary alone at /valkey-sidecar in an empty root, user
# 65532:65532, that binary as entrypoint, org.opencontainers.image.* labels. Both binaries come
# from scripts/static-build.sh, built from this checkout; the layers are reproducible (fixed owner,
# mode and mtime, the commit's time). Log in first (`crane auth login`, `helm registry login`); a
# registry on loopback is spoken to in plain HTTP. The last lines on stdout say what was pushed
# (image=, image_digest=, chart=, chart_digest=), for CI's attestations.
set -euo pipefail
cd "$(dirname "$0")/.."

prefix=${1:?usage: scripts/release.sh <registry>/<namespace>}
prefix=${prefix%/}
repo=$prefix/valkey-sidecar
crane=$(scripts/go-tool-bin.sh crane)
helm=${HELM_BIN:-$(scripts/helm-bin.sh)}
version=$(cargo pkgid --locked -p valkey-sidecar | sed 's/.*@//')
# The commit, as scripts/static-build.sh records it in the binaries (`-dirty`: uncommitted changes).
revision=$(git rev-parse HEAD)
[[ -z $(git status --porcelain --untracked-files=no) ]] || revision+=-dirty
epoch=$(git log -1 --format=%ct)
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
# Where the sources are (CI sets it to the repository's address).
source_label=()
[[ -z ${RELEASE_SOURCE_URL:-} ]] || source_label=(-l "org.opencontainers.image.source=$RELEASE_SOURCE_URL")
helm_http=()
case $prefix in 127.0.0.1:* | localhost:* | '[::1]':*) helm_http=(--plain-http) ;; esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
log() { echo "release: $*" >&2; }

# One platform's image, pushed as <version>-<goarch>; prints its digest reference.
push_platform() { # rust-arch go-arch
  local bin layer=$work/layer-$2.tar.gz
  bin=$(scripts/static-build.sh "$1")
  mkdir -p "$work/root-$2"
  cp "$bin" "$work/root-$2/valkey-sidecar"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mode=0755 --mtime="@$epoch" \
    -C "$work/root-$2" -cf - valkey-sidecar | gzip -n -9 >"$layer"
  "$crane" append --oci-empty-base -f "$layer" -t "$repo:$version-$2" >&2
  "$crane" mutate "$repo:$version-$2" -t "$repo:$version-$2" --set-platform "linux/$2" \
    --entrypoint /valkey-sidecar --user 65532:65532 \
    -l org.opencontainers.image.title=valkey-sidecar \
    -l "org.opencontainers.image.description=Sidecar agent for Valkey on Kubernetes: live role labels, hand-overs, failover, health endpoints" \
    -l "org.opencontainers.image.version=$version" \
    -l "org.opencontainers.image.revision=$revision" \
    -l "org.opencontainers.image.created=$created" \
    -l org.opencontainers.image.licenses=Apache-2.0 "${source_label[@]}"
}

# The chart, its default agent image the one just pushed; prints its digest.
push_chart() {
  cp -r charts/valkey-sidecar "$work/chart"
  local values=$work/chart/values.yaml default='repository: ghcr.io/valkey-sidecar/valkey-sidecar'
  grep -q "^    $default\$" "$values" || { log "values.yaml lost its line '$default'"; exit 1; }
  sed -i "s|^    $default\$|    repository: $repo|" "$values"
  "$helm" package "$work/chart" --version "$version" --app-version "$version" -d "$work/out" >&2
  "$helm" push "$work/out/valkey-sidecar-$version.tgz" "oci://$prefix/charts" "${helm_http[@]}" 2>&1 |
    tee "$work/push.log" >&2
  sed -n 's/^Digest: //p' "$work/push.log"
}

log "valkey-sidecar $version ($revision) to $prefix"
amd64=$(push_platform x86_64 amd64 | tail -1)
arm64=$(push_platform aarch64 arm64 | tail -1)
"$crane" index append -t "$repo:$version" -m "$amd64" -m "$arm64" >&2
digest=$("$crane" digest "$repo:$version")
chart_digest=$(push_chart)
echo "image=$repo:$version"
echo "image_digest=$digest"
echo "chart=oci://$prefix/charts/valkey-sidecar"
echo "chart_version=$version"
echo "chart_digest=$chart_digest"
