//! The chart's resources and what platform scanners make of it: every container has requests and
//! a memory limit (Valkey's from a named preset or in full), Valkey's `maxmemory` follows its
//! memory limit through the downward API unless the user sets one, a limit below its request is
//! refused at render, and checkov (pinned, `scripts/checkov-bin.sh`) fails nothing on the default
//! rendering, each install profile and each example — every finding the chart keeps is skipped
//! on its object with a reason.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};
use valkey_sidecar_testkit::k8s::chart::render;

#[path = "support/monitoring.rs"]
mod monitoring;

const RELEASE: &str = "valkey";
const NS: &str = "valkey";

fn render_sets(sets: &[&str]) -> Result<String, String> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    render(RELEASE, NS, &[], &sets).map_err(|e| format!("{e:#}"))
}

/// The first StatefulSet's pod spec rendered with `sets`.
fn pod(sets: &[&str]) -> Value {
    let rendered = render_sets(sets).unwrap_or_else(|e| panic!("{e}"));
    let sts = monitoring::yaml_documents(&rendered)
        .into_iter()
        .find(|o| o["kind"] == "StatefulSet")
        .unwrap();
    sts["spec"]["template"]["spec"].clone()
}

fn container<'a>(spec: &'a Value, name: &str) -> Option<&'a Value> {
    let all = ["initContainers", "containers"];
    all.iter()
        .filter_map(|k| spec[k].as_array())
        .flatten()
        .find(|c| c["name"] == name)
}

fn args(c: &Value) -> Vec<String> {
    let list = c["args"].as_array().cloned().unwrap_or_default();
    list.iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

/// The value after `flag` in `args`.
fn after(args: &[String], flag: &str) -> Option<String> {
    let at = args.iter().position(|a| a == flag)?;
    args.get(at + 1).cloned()
}

#[test]
fn every_preset_requests_its_memory_and_is_limited_to_it_without_a_cpu_limit() {
    let table = [
        ("nano", "100m", "256Mi"),
        ("small", "250m", "1Gi"),
        ("medium", "500m", "4Gi"),
        ("large", "1", "16Gi"),
        ("xlarge", "2", "64Gi"),
    ];
    for (preset, cpu, memory) in table {
        let spec = pod(&[&format!("valkey.resourcesPreset={preset}")]);
        let valkey = container(&spec, "valkey").unwrap();
        let expected = json!({
            "requests": {"cpu": cpu, "memory": memory},
            "limits": {"memory": memory},
        });
        assert_eq!(valkey["resources"], expected, "{preset}");
    }
    // The default is `small`; every other container has requests and a memory limit.
    let spec = pod(&[]);
    assert_eq!(
        container(&spec, "valkey").unwrap()["resources"]["limits"]["memory"],
        "1Gi"
    );
    for name in ["valkey-sidecar", "valkey-config", "install-await"] {
        let r = &container(&spec, name).unwrap()["resources"];
        assert!(!r["requests"]["cpu"].is_null(), "{name}: {r}");
        assert!(!r["requests"]["memory"].is_null(), "{name}: {r}");
        assert!(!r["limits"]["memory"].is_null(), "{name}: {r}");
        assert!(r["limits"]["cpu"].is_null(), "{name}: {r}");
    }
    // `none`: nothing for Valkey; full resources replace the preset.
    let none = pod(&["valkey.resourcesPreset=none"]);
    assert!(container(&none, "valkey").unwrap()["resources"].is_null());
    let own = pod(&[
        "valkey.resources.requests.memory=3Gi",
        "valkey.resources.limits.memory=3Gi",
    ]);
    let expected = json!({"requests": {"memory": "3Gi"}, "limits": {"memory": "3Gi"}});
    assert_eq!(container(&own, "valkey").unwrap()["resources"], expected);
}

#[test]
fn maxmemory_follows_the_memory_limit_through_the_downward_api_unless_set() {
    let spec = pod(&["valkey.maxmemoryPercent=60"]);
    let config = container(&spec, "valkey-config").unwrap();
    let a = args(config);
    assert_eq!(
        after(&a, "--memory-limit").unwrap(),
        "$(VALKEY_MEMORY_LIMIT)"
    );
    assert_eq!(after(&a, "--maxmemory-percent").unwrap(), "60");
    let env = &config["env"][0];
    assert_eq!(env["name"], "VALKEY_MEMORY_LIMIT");
    let field = json!({"containerName": "valkey", "resource": "limits.memory"});
    assert_eq!(env["valueFrom"]["resourceFieldRef"], field);
    let valkey = args(container(&spec, "valkey").unwrap());
    assert_eq!(
        after(&valkey, "--include").unwrap(),
        "/etc/valkey/config/valkey.conf"
    );
    assert_eq!(after(&valkey, "--maxmemory-policy").unwrap(), "noeviction");
    assert_eq!(after(&valkey, "--maxmemory"), None);

    // The user's maxmemory: as given, and no share of the limit.
    for sets in [
        &["valkey.maxmemory=2gb"][..],
        &["valkey.extraArgs={--maxmemory,2gb}"][..],
    ] {
        let spec = pod(sets);
        let valkey = args(container(&spec, "valkey").unwrap());
        assert_eq!(after(&valkey, "--maxmemory").unwrap(), "2gb", "{sets:?}");
        let config = args(container(&spec, "valkey-config").unwrap());
        assert!(!config.contains(&"--memory-limit".to_owned()), "{sets:?}");
    }
    // No limit: no maxmemory. Without auth either, nothing to include and no init container.
    let spec = pod(&["valkey.resourcesPreset=none"]);
    let config = args(container(&spec, "valkey-config").unwrap());
    assert!(!config.contains(&"--memory-limit".to_owned()), "{config:?}");
    let bare = pod(&["valkey.resourcesPreset=none", "auth.enabled=false"]);
    assert!(container(&bare, "valkey-config").is_none());
    let valkey = args(container(&bare, "valkey").unwrap());
    assert_eq!(after(&valkey, "--include"), None);
    // A limit without auth: the init container writes maxmemory only.
    let memory_only = pod(&["auth.enabled=false"]);
    let config = args(container(&memory_only, "valkey-config").unwrap());
    assert!(!config.contains(&"--passwords".to_owned()), "{config:?}");
    assert!(config.contains(&"--memory-limit".to_owned()), "{config:?}");
    let policy = pod(&["valkey.maxmemoryPolicy=allkeys-lru"]);
    let valkey = args(container(&policy, "valkey").unwrap());
    assert_eq!(after(&valkey, "--maxmemory-policy").unwrap(), "allkeys-lru");
}

#[test]
fn a_limit_below_its_request_and_unknown_presets_are_refused() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "valkey.resources.requests.memory=2Gi",
                "valkey.resources.limits.memory=1Gi",
            ],
            "valkey.resources: limits.memory 1Gi is below requests.memory 2Gi",
        ),
        (
            &[
                "sidecar.resources.requests.cpu=0.2",
                "sidecar.resources.limits.cpu=100m",
            ],
            "sidecar.resources: limits.cpu 100m is below requests.cpu 0.2",
        ),
        (
            &["sidecar.initResources.limits.memory=8Mi"],
            "sidecar.initResources: limits.memory 8Mi is below requests.memory 16Mi",
        ),
        (&["valkey.resourcesPreset=huge"], "resourcesPreset"),
        (&["valkey.maxmemoryPercent=99"], "maxmemoryPercent"),
        (
            &["valkey.resources.limits.memory=lots"],
            "/valkey/resources/limits/memory",
        ),
    ];
    for (sets, message) in cases {
        let err = render_sets(sets).unwrap_err();
        assert!(err.contains(message), "{sets:?}: {err}");
    }
    // Equal, and a limit in other units above its request, pass.
    render_sets(&[
        "valkey.resources.requests.memory=1024Mi",
        "valkey.resources.limits.memory=1Gi",
        "sidecar.resources.limits.cpu=0.5",
        "sidecar.resources.requests.cpu=100m",
    ])
    .unwrap();
}

/// What checkov runs as: `$CHECKOV_BIN`, else `scripts/checkov-bin.sh` (installs it once).
fn checkov_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("CHECKOV_BIN") {
        return bin.into();
    }
    let script = valkey_sidecar_testkit::repo_root().join("scripts/checkov-bin.sh");
    let out = Command::new(script).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().into()
}

/// Checkov's findings by file: the failed checks as `<check>:<resource>`, the skipped ones as
/// `(<check>, <reason>)`.
type Findings = BTreeMap<String, (Vec<String>, Vec<(String, String)>)>;

/// Checkov's results for every file of `dir`, by file name: (failed, skipped) as
/// `<check>:<resource>` and `(<check>, <reason>)`. Run in a network namespace of its own where
/// one can be made: a scan must not reach out. Not `--quiet`: it leaves out the skipped checks.
fn checkov(dir: &Path) -> Findings {
    let bin = checkov_bin();
    let mut cmd = if Command::new("unshare")
        .args(["-n", "true"])
        .status()
        .is_ok_and(|s| s.success())
    {
        let mut c = Command::new("unshare");
        c.arg("-n").arg(&bin);
        c
    } else {
        Command::new(&bin)
    };
    cmd.args([
        "--framework",
        "kubernetes",
        "--skip-download",
        "-o",
        "json",
        "-d",
    ]);
    let out = cmd.arg(dir).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{e}: {text}\n{}", String::from_utf8_lossy(&out.stderr)));
    let results = &report["results"];
    let file = |c: &Value| {
        let path = c["file_path"].as_str().unwrap();
        path.trim_start_matches('/').to_owned()
    };
    let mut by_file: Findings = BTreeMap::new();
    for c in results["failed_checks"].as_array().into_iter().flatten() {
        let (failed, _) = by_file.entry(file(c)).or_default();
        failed.push(format!("{}:{}", c["check_id"], c["resource"]));
    }
    for c in results["skipped_checks"].as_array().into_iter().flatten() {
        let (_, skipped) = by_file.entry(file(c)).or_default();
        let reason = c["check_result"]["suppress_comment"]
            .as_str()
            .unwrap_or_default();
        let check = c["check_id"].as_str().unwrap().to_owned();
        skipped.push((check, reason.to_owned()));
    }
    let passed = results["passed_checks"].as_array().map_or(0, Vec::len);
    assert!(passed > 100, "checkov passed only {passed} checks: {text}");
    by_file
}

#[test]
fn checkov_fails_nothing_the_chart_does_not_argue_on_every_profile_and_example() {
    // Not `.tmp…`: checkov skips hidden directories.
    let dir = tempfile::Builder::new()
        .prefix("chart-scan-")
        .tempdir()
        .unwrap();
    let renders: Vec<(&str, Vec<&str>)> = vec![
        ("default", vec![]),
        ("namespace", vec!["profile=namespace"]),
        ("restricted", vec!["profile=restricted"]),
        (
            "replication",
            vec!["mode=replication", "shards=1", "replicas=2"],
        ),
        ("exporter", vec!["metrics.exporter.enabled=true"]),
        ("no-auth", vec!["auth.enabled=false"]),
        // What the test can catch: without resources checkov must fail the chart.
        ("unsized", vec!["valkey.resourcesPreset=none"]),
    ];
    for (name, sets) in &renders {
        let text = render_sets(sets).unwrap();
        std::fs::write(dir.path().join(format!("{name}.yaml")), text).unwrap();
    }
    let examples = valkey_sidecar_testkit::repo_root().join("examples");
    for entry in std::fs::read_dir(&examples).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = render(RELEASE, NS, std::slice::from_ref(&path), &[]).unwrap();
            let name = format!("example-{}", path.file_name().unwrap().to_string_lossy());
            std::fs::write(dir.path().join(name), text).unwrap();
        }
    }
    let results = checkov(dir.path());
    let mut skipped = std::collections::BTreeSet::new();
    for (file, (failed, skips)) in &results {
        if file == "unsized.yaml" {
            for check in ["CKV_K8S_10", "CKV_K8S_12", "CKV_K8S_13"] {
                let found = failed.iter().any(|f| f.contains(check));
                assert!(found, "without resources {check} must fail: {failed:?}");
            }
            continue;
        }
        assert!(failed.is_empty(), "{file}: {failed:#?}");
        for (check, reason) in skips {
            assert!(
                reason.len() > 30,
                "{file}: {check} skipped without a reason"
            );
            skipped.insert(check.clone());
        }
    }
    // The skips are exactly the ones the chart README argues.
    let readme = std::fs::read_to_string(
        valkey_sidecar_testkit::repo_root().join("charts/valkey-sidecar/README.md"),
    )
    .unwrap();
    for check in &skipped {
        assert!(
            readme.contains(&format!("`{check}`")),
            "{check} is skipped but not in the README"
        );
    }
    println!("checkov skips: {skipped:?}");
}
