#!/usr/bin/env bash
# The advisory check: every crate in Cargo.lock against the RustSec advisory database. It needs
# the database from the network, so it is not part of the offline test command; run it wherever
# the database can be fetched (a release pipeline, a workstation). Exit code 0: no advisory applies.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo fetch --locked
exec "$(scripts/cargo-deny-bin.sh)" check advisories
