#!/usr/bin/env bash
# The advisory check: every crate in Cargo.lock against the RustSec advisory database.
#   scripts/advisories.sh             the database fetched from the network (a release pipeline,
#                                     a workstation): today's advisories
#   scripts/advisories.sh --offline   the snapshot in ../shared/vendor (checksummed), for the test
#                                     command on machines that cannot fetch it: the advisories
#                                     known on the snapshot's date, which the output names
# Exit code 0: no advisory applies.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fetch --locked
deny="$(scripts/cargo-deny-bin.sh)"
if [[ ${1:-} != --offline ]]; then
  exec "$deny" check advisories
fi

vendor=${VALKEY_SIDECAR_VENDOR:-../shared/vendor}
tarball=$(find "$vendor" -maxdepth 1 -name 'rustsec-advisory-db-*.tar.gz' | sort | tail -n 1)
[[ -n $tarball ]] || { echo "advisories: no RustSec snapshot in $vendor" >&2; exit 1; }
name=$(basename "$tarball")
sum=$(awk -v f="$name" '$2 == f { print $1 }' "$vendor/SHA256SUMS")
[[ -n $sum ]] || { echo "advisories: $name is not listed in $vendor/SHA256SUMS" >&2; exit 1; }
echo "$sum  $tarball" | sha256sum --check --quiet >&2

# cargo-deny reads a git checkout named after the database's URL under `db-path`; the snapshot
# becomes one commit dated as the snapshot (its newest file), so the database's age is true.
cache=${VALKEY_SIDECAR_CACHE:-$HOME/.cache/valkey-sidecar}
db=$cache/advisory-db-${sum:0:16}
if [[ ! -f $db/.complete ]]; then
  mkdir -p "$cache"
  work=$(mktemp -d "$cache/.advisory-db-XXXXXX")
  tar xzf "$tarball" -C "$work"
  repo=$work/advisory-db-3157b0e258782691
  mv "$work/advisory-db" "$repo"
  newest=$(find "$repo" -type f -printf '%T@\n' | sort -n | tail -n 1)
  when=$(date -u -d "@${newest%.*}" +%Y-%m-%dT%H:%M:%SZ)
  (cd "$repo" && git init -q && git add -A &&
    GIT_AUTHOR_DATE=$when GIT_COMMITTER_DATE=$when \
      git -c user.name=snapshot -c user.email=snapshot@localhost commit -q -m "snapshot $name")
  touch "$work/.complete"
  rm -rf "$db"
  mv -T "$work" "$db"
fi
echo "advisories: RustSec snapshot $name (offline)" >&2
config=$(mktemp)
trap 'rm -f "$config"' EXIT
# deny.toml's checks, plus where the database is. A snapshot is older than the default 90 days
# cargo-deny accepts by design: the age allowed is a year.
{
  cat deny.toml
  printf '\n[advisories]\ndb-path = "%s"\nmaximum-db-staleness = "P365D"\n' "$db"
} >"$config"
exec "$deny" --offline --config "$config" check advisories
