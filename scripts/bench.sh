#!/usr/bin/env bash
# The benchmark command: builds the release agent, runs every benchmark and the chaos tests on
# the local control plane, and regenerates docs/benchmarks.md (headline summary first, the
# figures that got worse since the previous report last), its plots (docs/plots/*.svg) and the
# README's seven rows of the summary. About 150 minutes on 2 cores; BENCH_* variables shorten it (see
# each section's command).
set -euo pipefail
cd "$(dirname "$0")/.."
# The commit measured, named before anything is built or written: uncommitted changes to
# tracked files make it `-dirty`.
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if ! git diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
fi
scripts/install-deps.sh
# Assigned before exported: `export X="$(cmd)"` hides a failing build from `set -e`.
VALKEY_SERVER="$(scripts/valkey-bin.sh)"
VALKEY_TESTKIT_K8S_BIN_DIR="$(scripts/k8s-bins.sh)"
HELM_BIN="$(scripts/helm-bin.sh)"
# The agent measured is the image's binary (static, musl, release: the Dockerfile's build).
VALKEY_SIDECAR_BIN="$(scripts/static-build.sh)"
export VALKEY_SERVER VALKEY_TESTKIT_K8S_BIN_DIR HELM_BIN VALKEY_SIDECAR_BIN
cargo build --release --locked -p valkey-sidecar-bench --bin bench
# The chaos tests, built before anything is timed.
chaos=(k8s_node_faults k8s_split_brain k8s_disruption k8s_rollout k8s_replication k8s_replication_coordinator k8s_coordinator k8s_chart k8s_labels k8s_full_restart k8s_operate)
cargo test --locked -p valkey-sidecar --no-run "${chaos[@]/#/--test=}"
export BENCH_PLOTS_DIR="$PWD/docs/plots"
# The build the report names (the summary block repeats it).
export BENCH_BUILD="commit \`$commit\`, \`$("$VALKEY_SIDECAR_BIN" --version)\`, the image's static binary (\`scripts/static-build.sh\`: release profile, musl)"
# Every benchmark configuration and chaos scenario appends its outcome here: the fault table.
export VALKEY_TESTKIT_FAULT_LOG="$(mktemp)"
# Every headline figure appends its row here: the summary.
export BENCH_SUMMARY_LOG="$(mktemp)"
out=docs/benchmarks.md
# The report being replaced, kept for the comparison at the end of the new one.
previous=$(mktemp)
if [ -f "$out" ]; then
  cat "$out" > "$previous"
fi
body=$(mktemp)
summary=$(mktemp)
report=$(mktemp)
compared=$(mktemp)
chaos_out=$(mktemp)
{
  echo "## Probes and footprint"
  echo
  target/release/bench probes
  target/release/bench footprint
  echo "## Live labels"
  echo
  BENCH_FLIPS="${BENCH_FLIPS:-30}" target/release/bench labels
  echo "## Kubernetes API usage"
  echo
  target/release/bench api
  echo "## Cluster mode: hand-over and crash, with the agents and without"
  echo
  BENCH_HANDOVERS="${BENCH_HANDOVERS:-20}" target/release/bench handover
  echo "## Replication mode: unplanned failover against Sentinel, planned switchover against FAILOVER TO"
  echo
  # The agent: 20 kills (~5 s each), 2 × 20 node cuts (~10 s each); Sentinel tuned, with the
  # chart's min-replicas settings: 20 crashes and 20 node cuts (~7 s each); Sentinel and Valkey
  # defaults: 10 of each (a node cut waits out the 30 s detection). About 25 minutes.
  BENCH_FAILOVERS="${BENCH_FAILOVERS:-20}" BENCH_POD_CUTS="${BENCH_POD_CUTS:-20}" \
    BENCH_SENTINEL_RUNS="${BENCH_SENTINEL_RUNS:-20}" BENCH_SENTINEL_DEFAULT_RUNS="${BENCH_SENTINEL_DEFAULT_RUNS:-10}" \
    target/release/bench failover
  BENCH_SWITCHOVERS="${BENCH_SWITCHOVERS:-20}" target/release/bench switchover
  echo "## Partitions and apiserver outages"
  echo
  # 20 partitions per configuration (the agent in both modes ~30 s each at the chart's 15 s
  # lease; Valkey Cluster alone and Sentinel at two lags, ~15 s each), 20 healthy windows of
  # 10 s per mode, the apiserver stopped for 5 minutes. About 50 minutes.
  BENCH_PARTITIONS="${BENCH_PARTITIONS:-20}" BENCH_HEALTHY_WINDOWS="${BENCH_HEALTHY_WINDOWS:-20}" \
    BENCH_OUTAGE_SECONDS="${BENCH_OUTAGE_SECONDS:-300}" target/release/bench partition
  echo "## Planner cost"
  echo
  target/release/bench planner
  echo "## Faults"
  echo
  # A failing chaos test is reported in the table's section, not hidden by aborting the run.
  status=0
  cargo test --locked -p valkey-sidecar --no-fail-fast "${chaos[@]/#/--test=}" -- --test-threads 1 \
    >"$chaos_out" 2>&1 || status=$?
  # The baselines beside them (StatefulSet's RollingUpdate beside the supervised roll).
  cargo test --locked -p valkey-sidecar --test k8s_rollout -- --ignored --test-threads 1 \
    >>"$chaos_out" 2>&1 || status=$?
  target/release/bench faults "$VALKEY_TESTKIT_FAULT_LOG"
  if [ "$status" -ne 0 ]; then
    echo "**The chaos tests failed in this run** (exit $status); their rows above are missing or partial:"
    echo
    grep -E '^test .* FAILED$' "$chaos_out" | sed 's/^/- /' || true
    echo
    echo "What each failure said (the whole output: \`target/bench-chaos.log\`):"
    echo
    echo '```'
    grep -E -A4 'panicked at' "$chaos_out" | cut -c1-400 | head -60 || true
    echo '```'
    echo
  fi
  # Kept for whoever reads a failure above.
  cp "$chaos_out" target/bench-chaos.log
} > "$body"
# Kept, like the chaos log: the summary and the README's block can be rendered again from it
# (`bench summary` / `bench summary-readme target/bench-summary.log`).
cp "$BENCH_SUMMARY_LOG" target/bench-summary.log
# The headline block, from the rows the sections logged: the same text goes into the README.
target/release/bench summary "$BENCH_SUMMARY_LOG" > "$summary"
# The README's shape of it: seven rows, without the alternatives' configurations.
readme_summary=$(mktemp)
target/release/bench summary-readme "$BENCH_SUMMARY_LOG" > "$readme_summary"
{
  echo "# Benchmarks"
  echo
  echo "Generated by \`scripts/bench.sh\` on $(date -u +%Y-%m-%d) ($(nproc) cores, $(uname -m)) from $BENCH_BUILD; numbers from one run on a shared machine. Plots are SVG files in \`docs/plots/\`: each bar is a p50, its whisker reaches the p99."
  echo
  echo "## Summary"
  echo
  cat "$summary"
  echo
  cat "$body"
} > "$report"
# Last, what got worse since the report this one replaces.
target/release/bench compare "$previous" "$report" > "$compared"
# cat, not mv: the report keeps the repository's file mode (mktemp makes files private).
{
  cat "$report"
  echo
  cat "$compared"
} > "$out"
target/release/bench readme "$readme_summary" README.md
rm -f "$previous" "$body" "$summary" "$readme_summary" "$report" "$compared" "$chaos_out" "$VALKEY_TESTKIT_FAULT_LOG" "$BENCH_SUMMARY_LOG"
cat "$out"
