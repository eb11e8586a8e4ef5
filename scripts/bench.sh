#!/usr/bin/env bash
# The benchmark command: builds the release agent, runs every benchmark and the chaos tests on
# the local control plane, and regenerates docs/benchmarks.md (headline summary first, the
# figures that got worse since the previous report last), its plots (docs/plots/*.svg) and the
# README's seven rows of the summary, docs/scale.md, docs/planner.md and docs/followers.md
# (reports of their own). About 175 minutes on 2 cores, about 60 more for scale and 40 for
# followers; BENCH_* variables shorten it (see each section's command).
#
# Resumable: each section keeps its output under target/bench-run/<commit>/ and a run at the same
# clean commit skips the sections already done, so an interrupted run loses only the section it
# was in (a dirty tree, or BENCH_FRESH=1, starts over). BENCH_SECTIONS="chaos probes ..." runs
# only those, in that order; the report is written once every section is done, all at one commit.
set -euo pipefail
cd "$(dirname "$0")/.."
# The commit measured, named before anything is built or written: uncommitted changes to
# tracked files make it `-dirty`.
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if ! git diff --quiet HEAD -- 2>/dev/null; then
  commit="$commit-dirty"
fi
state="target/bench-run/$commit"
# Only a clean commit's sections may be reused: a dirty tree can change between two runs.
case "$commit" in
  *-dirty | unknown) rm -rf "$state" ;;
esac
if [ -n "${BENCH_FRESH:-}" ]; then
  rm -rf "$state"
fi
mkdir -p "$state/plots"
scripts/install-deps.sh
# Assigned before exported: `export X="$(cmd)"` hides a failing build from `set -e`.
VALKEY_SERVER="$(scripts/valkey-bin.sh)"
VALKEY_TESTKIT_K8S_BIN_DIR="$(scripts/k8s-bins.sh)"
HELM_BIN="$(scripts/helm-bin.sh)"
# The agent measured is the image's binary (static, musl, release: the Dockerfile's build).
VALKEY_SIDECAR_BIN="$(scripts/static-build.sh)"
# The older Valkeys the roll rows start from (the chaos section's tests/k8s_rollout.rs).
VALKEY_SERVER_9_0_0="$(VALKEY_VERSION=9.0.0 scripts/valkey-bin.sh)"
VALKEY_SERVER_8_0_1="$(scripts/valkey-src-bin.sh)"
export VALKEY_SERVER VALKEY_TESTKIT_K8S_BIN_DIR HELM_BIN VALKEY_SIDECAR_BIN VALKEY_SERVER_9_0_0 VALKEY_SERVER_8_0_1
cargo build --release --locked -p valkey-sidecar-bench --bin bench
# The chaos tests, built before anything is timed.
chaos=(k8s_node_faults k8s_split_brain k8s_disruption k8s_rollout k8s_replication k8s_replication_coordinator k8s_coordinator k8s_chart k8s_labels k8s_full_restart k8s_operate)
cargo test --locked -p valkey-sidecar --no-run "${chaos[@]/#/--test=}"
export BENCH_PLOTS_DIR="$PWD/$state/plots"
# The build the report names (the summary block repeats it).
BENCH_BUILD="commit \`$commit\`, \`$("$VALKEY_SIDECAR_BIN" --version)\`, the image's static binary (\`scripts/static-build.sh\`: release profile, musl)"
export BENCH_BUILD

# The sections, in the report's order. Each writes its part of the report to stdout; the fault
# table's rows and the summary's rows go to its own logs.
sections=(probes labels api handover failover partition chaos)
# Sections with a report of their own, written as soon as they finish, so each can be measured
# again without the others: `scale` (about 40 minutes) goes to docs/scale.md, `planner` (the
# rules' cost up to 10,000 shards and the probes while they run; a few minutes) to
# docs/planner.md, `followers` (a watch on each Lease against polling it; about 40 minutes) to
# docs/followers.md.
own=(scale planner followers)

probes() {
  echo "## Probes and footprint"
  echo
  target/release/bench probes
  target/release/bench footprint
}

labels() {
  echo "## Live labels"
  echo
  BENCH_FLIPS="${BENCH_FLIPS:-30}" target/release/bench labels
}

api() {
  echo "## Kubernetes API usage"
  echo
  target/release/bench api
}

handover() {
  echo "## Cluster mode: hand-over and crash, with the agents and without"
  echo
  BENCH_HANDOVERS="${BENCH_HANDOVERS:-20}" target/release/bench handover
}

failover() {
  echo "## Replication mode: unplanned failover against Sentinel, planned switchover against FAILOVER TO"
  echo
  # The agent: 20 kills (~5 s each), 2 × 20 node cuts (~10 s each); Sentinel tuned, with the
  # chart's min-replicas settings: 20 crashes and 20 node cuts (~7 s each); Sentinel and Valkey
  # defaults: 10 of each (a node cut waits out the 30 s detection). About 25 minutes.
  BENCH_FAILOVERS="${BENCH_FAILOVERS:-20}" BENCH_POD_CUTS="${BENCH_POD_CUTS:-20}" \
    BENCH_SENTINEL_RUNS="${BENCH_SENTINEL_RUNS:-20}" BENCH_SENTINEL_DEFAULT_RUNS="${BENCH_SENTINEL_DEFAULT_RUNS:-10}" \
    target/release/bench failover
  BENCH_SWITCHOVERS="${BENCH_SWITCHOVERS:-20}" target/release/bench switchover
}

partition() {
  echo "## Partitions and apiserver outages"
  echo
  # 20 partitions per configuration (the agent in both modes ~30 s each at the chart's 15 s
  # lease; Valkey Cluster alone and Sentinel at two lags, ~15 s each), 20 healthy windows of
  # 10 s per mode, the apiserver stopped for 5 minutes. About 70 minutes.
  BENCH_PARTITIONS="${BENCH_PARTITIONS:-20}" BENCH_HEALTHY_WINDOWS="${BENCH_HEALTHY_WINDOWS:-20}" \
    BENCH_OUTAGE_SECONDS="${BENCH_OUTAGE_SECONDS:-300}" target/release/bench partition
}

planner() {
  echo "## Planner cost"
  echo
  target/release/bench planner
}

scale() {
  echo "## Scale"
  echo
  # Three chart installs of N shards × 2 pods (10, 25, 50: up to 100 Valkeys and 100 agents on
  # the control plane), each measured once: settle time, the coordinator's rounds and memory,
  # every agent's memory, requests per minute, a hand-over and a drain of every node.
  BENCH_SCALE_SHARDS="${BENCH_SCALE_SHARDS:-10 25 50}" target/release/bench scale
}

followers() {
  echo "## Followers: a watch on each Lease against a read every retry period"
  echo
  # Four chart installs (both modes, watch and polling), each with a 60 s steady window and the
  # holder's node cut 10 times at the chart's 15 s lease.
  BENCH_TAKEOVERS="${BENCH_TAKEOVERS:-10}" target/release/bench followers
}

# The chaos tests' rows go to the fault table (rendered when the report is assembled, with the
# benchmarks' rows); what this section prints is what failed. About 45 minutes.
chaos() {
  local out="$state/chaos.log"
  # A failing chaos test is reported in the table's section, not hidden by aborting the run.
  local status=0
  cargo test --locked -p valkey-sidecar --no-fail-fast "${chaos[@]/#/--test=}" -- --test-threads 1 \
    >"$out" 2>&1 || status=$?
  # The baselines beside them (StatefulSet's RollingUpdate beside the supervised roll).
  cargo test --locked -p valkey-sidecar --test k8s_rollout -- --ignored --test-threads 1 \
    >>"$out" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    echo "**The chaos tests failed in this run** (exit $status); their rows above are missing or partial:"
    echo
    grep -E '^test .* FAILED$' "$out" | sed 's/^/- /' || true
    echo
    echo "What each failure said (the whole output: \`target/bench-chaos.log\`):"
    echo
    echo '```'
    grep -E -A4 'panicked at' "$out" | cut -c1-400 | head -60 || true
    echo '```'
    echo
  fi
}

# Runs section $1 unless it is done already; its files are replaced whole, and
# it counts as done only once it has finished.
run_section() {
  local name=$1
  if [ -f "$state/$name.done" ]; then
    echo "bench: $name: done on $(cat "$state/$name.done") at $commit, kept" >&2
    return
  fi
  echo "bench: $name: started $(date -u '+%F %T')" >&2
  : >"$state/$name.faults"
  : >"$state/$name.summary"
  (
    export VALKEY_TESTKIT_FAULT_LOG="$PWD/$state/$name.faults"
    export BENCH_SUMMARY_LOG="$PWD/$state/$name.summary"
    "$name"
  ) >"$state/$name.md"
  date -u +%Y-%m-%d >"$state/$name.done"
  echo "bench: $name: finished $(date -u '+%F %T')" >&2
}

# A finished section with a report of its own: docs/<name>.md, from its part alone, and its plots.
own_report() {
  local name=$1
  {
    echo "# Benchmarks: $(head -n 1 "$state/$name.md" | sed 's/^## //')"
    echo
    echo "Generated by \`BENCH_SECTIONS=$name scripts/bench.sh\` (a report of its own; \`docs/benchmarks.md\` has the others) on $(cat "$state/$name.done") ($(nproc) cores, $(uname -m)) from $BENCH_BUILD; numbers from one run on a shared machine. Plots are SVG files in \`docs/plots/\`."
    echo
    tail -n +3 "$state/$name.md"
  } >"docs/$name.md"
  find "$state/plots" -name "$name*.svg" -exec cp {} docs/plots/ \;
  echo "bench: $name: docs/$name.md written" >&2
}

# BENCH_SECTIONS runs those sections in its own order (say, the longest first when a session is
# short); unknown names are refused before anything runs.
order=("${sections[@]}" "${own[@]}")
if [ -n "${BENCH_SECTIONS:-}" ]; then
  read -r -a order <<<"$BENCH_SECTIONS"
  for name in "${order[@]}"; do
    if [[ " ${sections[*]} ${own[*]} " != *" $name "* ]]; then
      echo "bench: unknown section $name (sections: ${sections[*]} ${own[*]})" >&2
      exit 64
    fi
  done
fi
for name in "${order[@]}"; do
  run_section "$name"
  if [[ " ${own[*]} " == *" $name "* ]]; then
    own_report "$name"
  fi
done
left=()
for name in "${sections[@]}"; do
  [ -f "$state/$name.done" ] || left+=("$name")
done
if [ "${#left[@]}" -gt 0 ]; then
  echo "bench: not done yet at $commit: ${left[*]}; run scripts/bench.sh again to finish (the report is unchanged)" >&2
  exit 0
fi

# Every section is done: the report, from the sections' parts in order.
faults_log="$state/all.faults"
summary_log="$state/all.summary"
body="$state/body.md"
: >"$faults_log"
: >"$summary_log"
: >"$body"
for name in "${sections[@]}"; do
  cat "$state/$name.faults" >>"$faults_log"
  cat "$state/$name.summary" >>"$summary_log"
  [ "$name" = chaos ] || cat "$state/$name.md" >>"$body"
done
{
  echo "## Faults"
  echo
  target/release/bench faults "$faults_log"
  cat "$state/chaos.md"
} >>"$body"
dates=$(cat "$state"/*.done | sort -u | paste -sd, - | sed 's/,/, /g')
# The report being replaced, kept for the comparison at the end of the new one.
out=docs/benchmarks.md
previous=$(mktemp)
if [ -f "$out" ]; then
  cat "$out" > "$previous"
fi
summary=$(mktemp)
report=$(mktemp)
compared=$(mktemp)
# Kept for whoever reads a failure in the report, and so the summary and the README's block can
# be rendered again (`bench summary` / `bench summary-readme target/bench-summary.log`).
cp "$state/chaos.log" target/bench-chaos.log
cp "$summary_log" target/bench-summary.log
# The headline block, from the rows the sections logged: the same text goes into the README.
target/release/bench summary "$summary_log" > "$summary"
# The README's shape of it: seven rows, without the alternatives' configurations.
readme_summary=$(mktemp)
target/release/bench summary-readme "$summary_log" > "$readme_summary"
{
  echo "# Benchmarks"
  echo
  echo "Generated by \`scripts/bench.sh\` on $dates ($(nproc) cores, $(uname -m)) from $BENCH_BUILD; numbers from one run on a shared machine. Plots are SVG files in \`docs/plots/\`: each bar is a p50, its whisker reaches the p99."
  echo
  echo "Scale (chart installs of 10 to 50 shards), the planner's cost (up to 10,000 shards) and followers watching against polling their Leases are reports of their own: \`docs/scale.md\`, \`docs/planner.md\`, \`docs/followers.md\`."
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
# The plots of this run replace the old ones (cp keeps the repository's files and their modes).
find "$state/plots" -name '*.svg' -exec cp {} docs/plots/ \;
target/release/bench readme "$readme_summary" README.md
rm -f "$previous" "$summary" "$readme_summary" "$report" "$compared"
cat "$out"
