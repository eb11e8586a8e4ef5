//! The fault table: every chaos scenario's outcome, read from the fault log the tests write
//! (`valkey_sidecar_testkit::faults`). The tests measure and assert; this only lays out what they
//! recorded, so the table is as current as the last run of the tests.

use std::path::Path;
use std::time::Duration;

use anyhow::{Result, bail};

use crate::report::percentile;
use valkey_sidecar_testkit::faults::{self, Outcome, show};

/// The test binaries with chaos scenarios, in the order the command runs them.
pub const TESTS: [&str; 11] = [
    "k8s_node_faults",
    "k8s_split_brain",
    "k8s_disruption",
    "k8s_rollout",
    "k8s_replication",
    "k8s_replication_coordinator",
    "k8s_coordinator",
    "k8s_chart",
    "k8s_labels",
    "k8s_full_restart",
    "k8s_operate",
];

/// `bench faults <log>`: the table of the outcomes in `log`.
pub fn run(log: &Path) -> Result<()> {
    let outcomes = faults::read(log)?;
    if outcomes.is_empty() {
        bail!(
            "the fault log {} holds no outcome: were the chaos tests run with {}?",
            log.display(),
            faults::FAULT_LOG_ENV
        );
    }
    print(&outcomes);
    Ok(())
}

/// Prints the section for `outcomes`: the tests' and any the caller adds (the bench's own runs).
pub fn print(outcomes: &[Outcome]) {
    println!("{}", markdown(outcomes));
}

/// The heading, the method with the command that reruns it, and the table.
pub fn markdown(outcomes: &[Outcome]) -> String {
    let mut out =
        String::from("### Fault table (the chaos tests on a real kube-apiserver v1.37.2)\n\n");
    out.push_str(&method());
    out.push_str(&builds(outcomes));
    out.push_str("\n\n| scenario | test | acknowledged writes | lost | acknowledged by a deposed primary | longest two-primary overlap | recovery | note |\n");
    out.push_str("|---|---|---|---|---|---|---|---|\n");
    for row in rows(outcomes) {
        out.push_str(&row);
        out.push('\n');
    }
    out
}

/// How the numbers came about, and the command.
fn method() -> String {
    let tests: Vec<String> = TESTS.iter().map(|t| format!("--test {t}")).collect();
    format!(
        "Each chaos test records what it measured as it ran (its assertions are the pass criteria; the table shows the numbers); the command: `VALKEY_TESTKIT_FAULT_LOG=<log> cargo test --locked -p valkey-sidecar {} -- --test-threads 1` and, for the baselines beside them (StatefulSet's `RollingUpdate` beside the supervised roll), `cargo test --locked -p valkey-sidecar --test k8s_rollout -- --ignored --test-threads 1`, then `target/release/bench faults <log>`. Writers are real clients (1 s timeouts, reconnects) that record which node acknowledged each write and when; every acknowledged key is read back from the final primary once the faulted node is back (lost); *acknowledged by a deposed primary* counts writes an old primary acknowledged after the new primary took its first write; the two-primary overlap comes from a checker polling every node's role and a write every few milliseconds from an address no fault cuts (its probe density is in the note); recovery is each scenario's own measure, named in its note. – : not measured by that scenario; a scenario run more than once has one row per run.",
        tests.join(" ")
    )
}

/// Which agent build the rows ran: figures come from the release build, and a row that did not
/// says so here.
fn builds(outcomes: &[Outcome]) -> String {
    let other: Vec<String> = outcomes
        .iter()
        .filter(|o| o.build != "release")
        .map(|o| {
            format!(
                "{} ({})",
                o.scenario,
                if o.build.is_empty() {
                    "unrecorded"
                } else {
                    &o.build
                }
            )
        })
        .collect();
    match other.is_empty() {
        true => " Every row ran the release build of the agent.".into(),
        false => format!(
            " Rows that did not run the release build of the agent: {}.",
            other.join("; ")
        ),
    }
}

/// One Markdown row per outcome, grouped by test binary in the command's order (others, such as
/// the bench's own runs, last), else in the order given; repeated scenarios are numbered
/// ("(run 2)") so that the rows can be told apart. A rerun test thus lands in its place.
pub fn rows(outcomes: &[Outcome]) -> Vec<String> {
    let mut sorted = outcomes.to_vec();
    sorted.sort_by_key(|o| {
        TESTS
            .iter()
            .position(|t| *t == o.test)
            .unwrap_or(TESTS.len())
    });
    sorted
        .iter()
        .enumerate()
        .map(|(i, o)| row(o, run_number(&sorted, i)))
        .collect()
}

/// Which run of its scenario `outcomes[i]` is, when the scenario ran more than once.
fn run_number(outcomes: &[Outcome], i: usize) -> Option<usize> {
    let same = |o: &Outcome| o.test == outcomes[i].test && o.scenario == outcomes[i].scenario;
    let runs = outcomes.iter().filter(|o| same(o)).count();
    (runs > 1).then(|| outcomes[..=i].iter().filter(|o| same(o)).count())
}

fn row(o: &Outcome, run: Option<usize>) -> String {
    let scenario = match run {
        Some(n) => format!("{} (run {n})", o.scenario),
        None => o.scenario.clone(),
    };
    let count = |n: Option<usize>| n.map_or("–".into(), |n| n.to_string());
    let time = |d: Option<Duration>| d.map_or("–".into(), show);
    format!(
        "| {} | `{}` | {} | {} | {} | {} | {} | {} |",
        cell(&scenario),
        cell(&o.test),
        count(o.acked),
        count(o.lost),
        count(o.deposed),
        time(o.overlap),
        time(o.recovery),
        cell(&o.note)
    )
}

/// Text safe inside a table cell: a `|` would end the cell, a newline the row.
pub fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

/// One benchmark configuration's runs, as measured.
pub struct Runs<'a> {
    pub scenario: &'a str,
    pub acked: Option<usize>,
    pub lost: usize,
    /// Writes a deposed primary acknowledged after the new one's first, where measured.
    pub deposed: Option<usize>,
    /// Each run's time to recover (`what` says from what to what).
    pub recovery: Vec<Duration>,
    pub what: &'a str,
}

/// Logs a benchmark configuration's runs as one row of the fault table (when the fault log is
/// on, as `scripts/bench.sh` sets it): recovery is the median, the note gives p99 and the count.
pub fn record_runs(bench: &str, r: Runs<'_>) {
    let mut v = r.recovery;
    v.sort();
    let mut o = Outcome::new(&format!("bench {bench}"), r.scenario).note(r.what);
    if !v.is_empty() {
        let (p50, p99) = (percentile(&v, 0.5), percentile(&v, 0.99));
        let note = format!(
            "recovery: {}; median of {} runs, p99 {}",
            r.what,
            v.len(),
            show(p99)
        );
        o = o.recovery(p50).note(note);
    }
    o.acked = r.acked;
    o.lost = Some(r.lost);
    o.deposed = r.deposed;
    faults::record(&o);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    /// Two lines the tests would write, one scenario twice, and a blank line.
    const SAMPLE: &str = concat!(
        r#"{"scenario":"primary cut off from the apiserver","test":"k8s_split_brain","acked":51234,"lost":0,"overlap_ms":0.0,"recovery_ms":3812.5,"note":"recovery: cut → promoted | labelled"}"#,
        "\n\n",
        r#"{"scenario":"two evictions in one shard at once","test":"k8s_disruption","acked":null,"lost":null,"overlap_ms":null,"recovery_ms":3100.0,"note":"no writer"}"#,
        "\n",
        r#"{"scenario":"primary cut off from the apiserver","test":"k8s_split_brain","acked":50000,"lost":2,"overlap_ms":1.5,"recovery_ms":4000.0,"note":"second"}"#,
        "\n",
    );

    fn sample() -> Vec<Outcome> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults.jsonl");
        std::fs::write(&path, SAMPLE).unwrap();
        faults::read(&path).unwrap()
    }

    #[test]
    fn faults_rows_show_each_run_by_test_and_dashes_for_what_was_not_measured() {
        let rows = rows(&sample());
        assert_eq!(
            rows,
            [
                "| primary cut off from the apiserver (run 1) | `k8s_split_brain` | 51234 | 0 | – | 0 ms | 3.81 s | recovery: cut → promoted \\| labelled |",
                "| primary cut off from the apiserver (run 2) | `k8s_split_brain` | 50000 | 2 | – | 1.5 ms | 4.00 s | second |",
                "| two evictions in one shard at once | `k8s_disruption` | – | – | – | – | 3.10 s | no writer |",
            ]
        );
    }

    #[test]
    fn faults_section_has_the_heading_the_command_and_the_table() {
        let md = markdown(&sample());
        assert!(md.starts_with("### Fault table ("), "{md}");
        let command = "`VALKEY_TESTKIT_FAULT_LOG=<log> cargo test --locked -p valkey-sidecar --test k8s_node_faults --test k8s_split_brain --test k8s_disruption --test k8s_rollout --test k8s_replication --test k8s_replication_coordinator --test k8s_coordinator --test k8s_chart --test k8s_labels --test k8s_full_restart --test k8s_operate -- --test-threads 1` and, for the baselines beside them (StatefulSet's `RollingUpdate` beside the supervised roll), `cargo test --locked -p valkey-sidecar --test k8s_rollout -- --ignored --test-threads 1`, then `target/release/bench faults <log>`";
        assert!(md.contains(command), "{md}");
        let table: Vec<&str> = md.lines().filter(|l| l.starts_with('|')).collect();
        assert_eq!(table.len(), 2 + 3, "{md}");
        let cells = |l: &&str| l.starts_with("|---") || l.matches(" | ").count() == 7;
        assert!(table.iter().all(cells), "eight cells a row: {md}");
    }

    /// The table names the command `scripts/bench.sh` runs: the same test binaries.
    #[test]
    fn the_tests_are_the_ones_bench_sh_reruns() {
        let script = valkey_sidecar_testkit::repo_root().join("scripts/bench.sh");
        let text = std::fs::read_to_string(script).unwrap();
        let line = text.lines().find(|l| l.starts_with("chaos=(")).unwrap();
        let listed: Vec<&str> = line
            .trim_start_matches("chaos=(")
            .trim_end_matches(')')
            .split_whitespace()
            .collect();
        assert_eq!(listed, TESTS);
    }

    #[test]
    fn faults_an_empty_log_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.jsonl");
        std::fs::write(&path, "").unwrap();
        assert!(run(&path).is_err());
    }
}
