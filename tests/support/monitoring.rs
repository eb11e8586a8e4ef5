//! What the monitoring tests share (`tests/monitoring.rs`, and the live check in
//! `tests/k8s_chart.rs`, the chart tests in `tests/chart.rs`): the chart's alert rules and
//! dashboard, the metric names their queries use, and the names an agent's `/metrics` exports.
// Each test crate that includes this module uses only part of it.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde_json::Value;

/// A file of the chart's `files/` folder (the one source of the rules and the dashboard).
pub fn chart_file(name: &str) -> PathBuf {
    valkey_sidecar_testkit::repo_root()
        .to_path_buf()
        .join("charts/valkey-sidecar/files")
        .join(name)
}

pub fn read(name: &str) -> String {
    let path = chart_file(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A YAML document as JSON (every scalar a string), by the crate's own YAML reader.
pub fn yaml(text: &str) -> Value {
    let mut docs = yaml_documents(text);
    assert_eq!(docs.len(), 1, "one YAML document");
    docs.remove(0)
}

/// Every YAML document of `text` as JSON (every scalar a string).
pub fn yaml_documents(text: &str) -> Vec<Value> {
    use valkey_sidecar::inject::yaml::{Node, Value as Yaml};
    fn json_of(node: &Node) -> Value {
        match &node.value {
            Yaml::Scalar(s) => Value::String(s.value.clone()),
            Yaml::Seq(items) => Value::Array(items.iter().map(json_of).collect()),
            Yaml::Map(entries) => Value::Object(
                entries
                    .iter()
                    .map(|(k, v)| {
                        (
                            json_of(k).as_str().unwrap_or_default().to_owned(),
                            json_of(v),
                        )
                    })
                    .collect(),
            ),
        }
    }
    let docs = valkey_sidecar::inject::yaml::parse(text, 1).unwrap();
    docs.iter().map(json_of).filter(Value::is_object).collect()
}

/// The alerting rules of `prometheus-rules.yaml`.
pub fn alerts() -> Vec<Value> {
    let rules = yaml(&read("prometheus-rules.yaml"));
    rules["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

/// Every alert's expression, by alert name.
pub fn alert_queries() -> Vec<(String, String)> {
    alerts()
        .iter()
        .map(|r| {
            let name = r["alert"].as_str().unwrap().to_owned();
            (name, r["expr"].as_str().unwrap().to_owned())
        })
        .collect()
}

/// The dashboard, parsed (a panic names the JSON error).
pub fn dashboard() -> Value {
    serde_json::from_str(&read("dashboard.json")).unwrap_or_else(|e| panic!("dashboard.json: {e}"))
}

/// Every PromQL query of the dashboard (panel targets and query variables), by where it is.
pub fn dashboard_queries() -> Vec<(String, String)> {
    let d = dashboard();
    let mut out = Vec::new();
    for p in d["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let title = p["title"].as_str().unwrap();
            out.push((
                format!("panel {title:?}"),
                t["expr"].as_str().unwrap().to_owned(),
            ));
        }
    }
    for v in d["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"]["query"].as_str() {
            out.push((format!("variable {}", v["name"]), q.to_owned()));
        }
    }
    out
}

/// The agent's metric names a query uses (`valkey_sidecar_…` identifiers).
pub fn metric_names(query: &str) -> BTreeSet<String> {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    query
        .split(|c: char| !ident(c))
        .filter(|t| t.starts_with("valkey_sidecar_"))
        .map(str::to_owned)
        .collect()
}

/// The series names an OpenMetrics exposition declares or holds: from `# TYPE` lines (a
/// counter's samples end in `_total`, a histogram's in `_bucket`, `_sum`, `_count`) and from the
/// samples themselves.
pub fn exported_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(decl) = line.strip_prefix("# TYPE ") {
            let mut parts = decl.split_whitespace();
            let (Some(name), Some(kind)) = (parts.next(), parts.next()) else {
                continue;
            };
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[""],
            };
            names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            if end > 0 {
                names.insert(line[..end].to_owned());
            }
        }
    }
    names
}

/// Every (where, metric name) of the rules and the dashboard that `exported` lacks.
pub fn missing_names(exported: &BTreeSet<String>) -> Vec<(String, String)> {
    let queries = alert_queries()
        .into_iter()
        .map(|(a, q)| (format!("alert {a}"), q))
        .chain(dashboard_queries());
    let mut missing = Vec::new();
    for (place, query) in queries {
        for name in metric_names(&query) {
            if !exported.contains(&name) {
                missing.push((place.clone(), name));
            }
        }
    }
    missing
}
