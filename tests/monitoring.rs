//! Monitoring: the chart's alert rules (`charts/valkey-sidecar/files/prometheus-rules.yaml`) pass
//! `promtool check rules` and their unit tests (`promtool test rules`, promtool built from
//! Prometheus' Go module by `scripts/go-tool-bin.sh promtool`), every alert has a case that fires and one
//! that must not, and the dashboard (`files/dashboard.json`) is valid JSON whose queries parse
//! and use only metrics the agent exports. That a running agent of the chart exports them is
//! checked on a real install in `tests/k8s_chart.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "support/monitoring.rs"]
mod monitoring;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use monitoring::{
    alert_queries, alerts, chart_file, dashboard, dashboard_queries, exported_names, metric_names,
    missing_names, yaml,
};
use serde_json::Value;
use valkey_sidecar::runtime::metrics::Metrics;
use valkey_sidecar_core::health::{Bounds, HealthState};
use valkey_sidecar_core::time::Millis;

/// `$PROMTOOL_BIN`, else what `scripts/go-tool-bin.sh promtool` prints (it builds promtool if needed).
fn promtool() -> PathBuf {
    if let Ok(p) = std::env::var("PROMTOOL_BIN") {
        return PathBuf::from(p);
    }
    let script = valkey_sidecar_testkit::repo_root().join("scripts/go-tool-bin.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("promtool")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(stdout.lines().last().unwrap().trim())
}

/// Runs promtool in `dir`; its output when it fails.
fn run_promtool(dir: &Path, args: &[&str]) -> Result<String, String> {
    let out = Command::new(promtool())
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let dir = chart_file("");
    let checked = run_promtool(&dir, &["check", "rules", "prometheus-rules.yaml"])
        .unwrap_or_else(|e| panic!("promtool check rules:\n{e}"));
    let count = alerts().len();
    assert!(
        checked.contains(&format!("SUCCESS: {count} rules found")),
        "{checked}"
    );
    let tested = run_promtool(&dir, &["test", "rules", "prometheus-rules.test.yaml"])
        .unwrap_or_else(|e| panic!("promtool test rules:\n{e}"));
    assert!(tested.contains("SUCCESS"), "{tested}");
}

/// Alert name → (cases where it fires, cases where it must not), from the unit tests.
fn cases() -> BTreeMap<String, (usize, usize)> {
    let tests = yaml(&std::fs::read_to_string(chart_file("prometheus-rules.test.yaml")).unwrap());
    let mut cases: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for t in tests["tests"].as_array().unwrap() {
        for case in t["alert_rule_test"].as_array().unwrap() {
            let name = case["alertname"].as_str().unwrap().to_owned();
            let fires = case["exp_alerts"].as_array().is_some_and(|a| !a.is_empty());
            let entry = cases.entry(name).or_default();
            if fires {
                entry.0 += 1;
            } else {
                entry.1 += 1;
            }
        }
    }
    cases
}

#[test]
fn every_alert_has_a_case_that_fires_and_one_that_must_not() {
    let cases = cases();
    let names: BTreeSet<String> = alert_queries().into_iter().map(|(n, _)| n).collect();
    let tested: BTreeSet<String> = cases.keys().cloned().collect();
    assert_eq!(names, tested, "alerts without tests, or tests of no alert");
    for (name, (fires, quiet)) in &cases {
        assert!(
            *fires >= 1 && *quiet >= 1,
            "{name}: {fires} firing, {quiet} quiet cases"
        );
    }
    let total: usize = cases.values().map(|(f, q)| f + q).sum();
    println!("{} alerts, {total} test cases", cases.len());
}

/// `## Heading` → its GitHub anchor (lower case, spaces to dashes, punctuation dropped).
fn anchors(markdown: &str) -> BTreeSet<String> {
    markdown
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .map(|h| {
            h.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

#[test]
fn every_alert_says_how_bad_where_and_what_to_do() {
    let ops =
        std::fs::read_to_string(valkey_sidecar_testkit::repo_root().join("docs/operations.md"))
            .unwrap();
    let anchors = anchors(&ops);
    for rule in alerts() {
        let name = rule["alert"].as_str().unwrap();
        let severity = rule["labels"]["severity"].as_str().unwrap_or_default();
        assert!(
            ["warning", "critical"].contains(&severity),
            "{name}: severity {severity:?}"
        );
        let annotations = &rule["annotations"];
        let (summary, description) = (
            annotations["summary"].as_str().unwrap(),
            annotations["description"].as_str().unwrap(),
        );
        for text in [summary, description] {
            assert!(text.contains("$labels.namespace"), "{name}: {text}");
            // Where: the pod, or (for what concerns a whole deployment) the deployment or shard.
            let place = ["$labels.pod", "$labels.shard", "$labels.valkey_io_cluster"];
            assert!(place.iter().any(|p| text.contains(p)), "{name}: {text}");
        }
        let runbook = annotations["runbook"].as_str().unwrap();
        let anchor = runbook
            .strip_prefix("docs/operations.md#")
            .unwrap_or_else(|| panic!("{name}: runbook {runbook}"));
        assert_eq!(anchor, name.to_lowercase(), "{name}");
        assert!(anchors.contains(anchor), "{name}: no heading for {runbook}");
        assert!(
            description.contains(runbook),
            "{name}: the description names the runbook"
        );
    }
}

/// Every name the agent's exposition declares, with every family it has.
fn agent_names() -> BTreeSet<String> {
    // A family is exported from its first entry on: one of each.
    let m = Metrics::new();
    m.tick(Duration::from_millis(1), Some("timeout"));
    m.label_write(Duration::from_millis(3), None);
    m.event("Promoted", "ok");
    m.zone_push(true);
    m.keeper_action("fence");
    m.formation_step("meet", true);
    m.watch_error("pods", &"gone");
    m.task_supervised("observer");
    m.shard_record("ok");
    m.action("Handover", "ok");
    m.coordinator_record_read("ok");
    m.coordinator_move_duration(Duration::from_millis(40));
    m.drift(std::iter::empty());
    m.http("/livez", 200);
    m.http_connection_closed("done");
    m.shard_primaries(&[("0".to_owned(), 1)].into());
    let bounds = Bounds {
        liveness_window_ms: 30_000,
        stale_after_ms: 2_000,
        max_lag_bytes: 1 << 20,
    };
    m.update(&HealthState::default(), Millis(0), &bounds, false);
    // After `update`, which removes an unknown lag.
    m.lag(Some(0));
    exported_names(&m.encode())
}

#[test]
fn the_rules_and_the_dashboard_use_only_the_agents_metrics() {
    let exported = agent_names();
    assert!(
        exported.contains("valkey_sidecar_coordinator_actions_total"),
        "{exported:?}"
    );
    let missing = missing_names(&exported);
    assert!(missing.is_empty(), "not exported by the agent: {missing:?}");
}

#[test]
fn the_dashboard_is_valid_json_with_the_panels_an_operator_needs() {
    let d = dashboard();
    assert_eq!(d["uid"], "valkey-sidecar");
    let panels = d["panels"].as_array().unwrap();
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");
    let used: BTreeSet<String> = dashboard_queries()
        .iter()
        .flat_map(|(_, q)| metric_names(q))
        .collect();
    // Role, readiness, lag, the coordinator, moves and their durations, label writes, errors, panics,
    // fences, drift.
    for want in [
        "valkey_sidecar_role",
        "valkey_sidecar_ready",
        "valkey_sidecar_replica_lag_bytes",
        "valkey_sidecar_coordinator_leader",
        "valkey_sidecar_coordinator_actions_total",
        "valkey_sidecar_coordinator_move_duration_seconds_bucket",
        "valkey_sidecar_label_writes_total",
        "valkey_sidecar_observation_errors_total",
        "valkey_sidecar_task_panics_total",
        "valkey_sidecar_fenced",
        "valkey_sidecar_placement_drift",
        "valkey_sidecar_shard_labelled_primaries",
    ] {
        assert!(used.contains(want), "no panel shows {want}");
    }
    for p in panels {
        let ds = &p["datasource"]["uid"];
        assert_eq!(
            ds, "${datasource}",
            "panel {}: its data source is the variable",
            p["title"]
        );
    }
}

/// The dashboard's queries with its variables set, as recording rules: `promtool check rules`
/// parses every one of them as Prometheus would.
#[test]
fn the_dashboard_queries_are_valid_promql() {
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, (_, query)) in dashboard_queries().iter().enumerate() {
        let q = query
            .replace("$__rate_interval", "1m")
            .replace("$namespace", "shop")
            .replace("$cluster", ".*");
        // `label_values(…)` is Grafana's, not PromQL: its argument is the query.
        let q = match q.strip_prefix("label_values(") {
            Some(rest) => rest.rsplit_once(',').unwrap().0.to_owned(),
            None => q,
        };
        let q = serde_json::to_string(&Value::String(q)).unwrap();
        rules.push_str(&format!(
            "      - record: dashboard:query_{i}\n        expr: {q}\n"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("dashboard-rules.yaml"), &rules).unwrap();
    run_promtool(dir.path(), &["check", "rules", "dashboard-rules.yaml"])
        .unwrap_or_else(|e| panic!("{e}\n{rules}"));
}
