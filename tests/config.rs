//! Bad configuration: the binary exits with code 64 and names every bad variable at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn run(env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_valkey-sidecar"));
    cmd.env_clear().args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run valkey-sidecar")
}

/// Asserts exit code 64 and that stderr names exactly `vars` (in any order) as bad.
fn assert_rejected(env: &[(&str, &str)], vars: &[&str]) {
    let out = run(env, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "stderr: {stderr}");
    for var in vars {
        assert!(
            stderr.contains(&format!("  {var}=")),
            "{var} not named in: {stderr}"
        );
    }
    let named = stderr.lines().filter(|l| l.starts_with("  ")).count();
    assert_eq!(named, vars.len(), "unexpected extra problems: {stderr}");
}

#[test]
fn bad_enums() {
    assert_rejected(
        &[
            ("SIDECAR_MODE", "sentinel"),
            ("SIDECAR_LOG_FORMAT", "xml"),
            ("VALKEY_TLS", "maybe"),
        ],
        &["SIDECAR_MODE", "SIDECAR_LOG_FORMAT", "VALKEY_TLS"],
    );
}

#[test]
fn bad_durations_and_numbers() {
    assert_rejected(
        &[
            ("SIDECAR_POLL_INTERVAL", "250"),
            ("SIDECAR_VALKEY_TIMEOUT", "0ms"),
            ("SIDECAR_LIVENESS_WINDOW", "2h"),
            ("SIDECAR_STALE_AFTER", "soon"),
            ("SIDECAR_MAX_LAG_BYTES", "-5"),
        ],
        &[
            "SIDECAR_POLL_INTERVAL",
            "SIDECAR_VALKEY_TIMEOUT",
            "SIDECAR_LIVENESS_WINDOW",
            "SIDECAR_STALE_AFTER",
            "SIDECAR_MAX_LAG_BYTES",
        ],
    );
}

#[test]
fn bad_addresses() {
    assert_rejected(
        &[
            ("VALKEY_ADDR", "valkey"),
            ("SIDECAR_PROBE_ADDR", "localhost:80"),
            ("SIDECAR_ADMIN_ADDR", "0.0.0.0:9737"),
            ("POD_IP", "10.0.0.300"),
        ],
        &[
            "VALKEY_ADDR",
            "SIDECAR_PROBE_ADDR",
            "SIDECAR_ADMIN_ADDR",
            "POD_IP",
        ],
    );
}

#[test]
fn bad_identity() {
    assert_rejected(
        &[
            ("POD_NAME", "Valkey_0"),
            ("POD_NAMESPACE", "-ns"),
            ("NODE_NAME", "node 1"),
            ("SIDECAR_ZONE", "zone a"),
            ("SIDECAR_REGION", &"r".repeat(64)),
        ],
        &[
            "POD_NAME",
            "POD_NAMESPACE",
            "NODE_NAME",
            "SIDECAR_ZONE",
            "SIDECAR_REGION",
        ],
    );
}

#[test]
fn missing_files() {
    assert_rejected(
        &[
            ("VALKEY_PASSWORD_FILE", "/nonexistent/pw"),
            ("VALKEY_TLS", "true"),
            ("VALKEY_TLS_CERT_FILE", "/nonexistent/cert.pem"),
        ],
        // TLS on without a CA, and a cert without its key: each named.
        &[
            "VALKEY_PASSWORD_FILE",
            "VALKEY_TLS_CA_FILE",
            "VALKEY_TLS_CERT_FILE",
        ],
    );
}

#[test]
fn a_password_and_a_password_file_together_exit_64_without_showing_the_password() {
    let file = std::env::current_exe().unwrap();
    let env = [
        ("VALKEY_PASSWORD", "hunter2-s3cret"),
        ("VALKEY_PASSWORD_FILE", file.to_str().unwrap()),
    ];
    assert_rejected(&env, &["VALKEY_PASSWORD", "VALKEY_PASSWORD_FILE"]);
    let out = run(&env, &[]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("hunter2"));
    // --help names the variable but never its value.
    let out = run(&env[..1], &["--help"]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("[env: VALKEY_PASSWORD]"), "{help}");
    assert!(!help.contains("hunter2"), "{help}");
}

#[test]
fn tls_key_without_cert() {
    let key = std::env::current_exe().unwrap();
    let key = key.to_str().unwrap();
    assert_rejected(
        &[
            ("VALKEY_TLS", "true"),
            ("VALKEY_TLS_CA_FILE", key),
            ("VALKEY_TLS_KEY_FILE", key),
        ],
        &["VALKEY_TLS_CERT_FILE"],
    );
}

#[test]
fn tls_ca_that_is_not_pem_exits_64() {
    let not_pem = std::env::current_exe().unwrap();
    let out = run(
        &[
            ("VALKEY_TLS", "true"),
            ("VALKEY_TLS_CA_FILE", not_pem.to_str().unwrap()),
            ("SIDECAR_PROBE_ADDR", "127.0.0.1:0"),
            ("SIDECAR_ADMIN_ADDR", "127.0.0.1:0"),
        ],
        &[],
    );
    assert_eq!(
        out.status.code(),
        Some(64),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("VALKEY_TLS_CA_FILE"));
}

#[test]
fn bad_label_settings() {
    assert_rejected(
        &[
            ("SIDECAR_LABELS", "true"),
            ("SIDECAR_ROLE_LABEL", "Valkey.io/Role"),
            ("SIDECAR_ROLE_VALUES", "primary"),
            ("SIDECAR_SHARD_NAME", "shard one"),
            ("SIDECAR_EVENTS", "sometimes"),
            ("SIDECAR_LEASE_OWNER", "my leases"),
        ],
        // Labels on without a pod to label: POD_NAME is named too.
        &[
            "SIDECAR_ROLE_LABEL",
            "SIDECAR_ROLE_VALUES",
            "SIDECAR_SHARD_NAME",
            "SIDECAR_EVENTS",
            "SIDECAR_LEASE_OWNER",
            "POD_NAME",
        ],
    );
}

#[test]
fn bad_coordinator_settings() {
    let base = [("POD_NAME", "valkey-0"), ("POD_NAMESPACE", "demo")];
    let bad = [
        ("SIDECAR_COORDINATOR", "true"),
        ("SIDECAR_LEASE_DURATION", "5s"),
        ("SIDECAR_FAILBACK", "perhaps"),
        ("SIDECAR_PREFERRED_ZONES", "s1"),
        ("SIDECAR_ROLL", "1"),
        ("SIDECAR_COORDINATION", "operators"),
        ("SIDECAR_OPERATOR_RESOURCE", "Not A Name"),
        ("SIDECAR_LEASE_WATCH", "poll"),
    ];
    // Coordinator on without a cluster name; a lease shorter than its renew deadline.
    let env: Vec<_> = base.iter().chain(bad.iter()).copied().collect();
    assert_rejected(
        &env,
        &[
            "SIDECAR_CLUSTER_NAME",
            "SIDECAR_LEASE_DURATION",
            "SIDECAR_FAILBACK",
            "SIDECAR_PREFERRED_ZONES",
            "SIDECAR_ROLL",
            "SIDECAR_COORDINATION",
            "SIDECAR_OPERATOR_RESOURCE",
            "SIDECAR_LEASE_WATCH",
        ],
    );
    let env: Vec<_> = base
        .iter()
        .chain(bad.iter())
        .chain([("SIDECAR_CLUSTER_NAME", "c1")].iter())
        .copied()
        .collect();
    assert_rejected(
        &env,
        &[
            "SIDECAR_LEASE_DURATION",
            "SIDECAR_FAILBACK",
            "SIDECAR_PREFERRED_ZONES",
            "SIDECAR_ROLL",
            "SIDECAR_COORDINATION",
            "SIDECAR_OPERATOR_RESOURCE",
            "SIDECAR_LEASE_WATCH",
        ],
    );
}

#[test]
fn unknown_flag_is_a_usage_error() {
    let out = run(&[], &["--no-such-flag"]);
    assert_eq!(out.status.code(), Some(64));
}

#[test]
fn help_documents_every_variable() {
    let out = run(&[], &["--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for var in [
        "POD_NAME",
        "POD_NAMESPACE",
        "NODE_NAME",
        "POD_IP",
        "SIDECAR_ZONE",
        "SIDECAR_REGION",
        "VALKEY_ADDR",
        "VALKEY_USERNAME",
        "VALKEY_PASSWORD_FILE",
        "VALKEY_PASSWORD",
        "VALKEY_TLS",
        "VALKEY_TLS_CA_FILE",
        "VALKEY_TLS_CERT_FILE",
        "VALKEY_TLS_KEY_FILE",
        "VALKEY_TLS_SERVER_NAME",
        "SIDECAR_MODE",
        "SIDECAR_PROBE_ADDR",
        "SIDECAR_ADMIN_ADDR",
        "SIDECAR_POLL_INTERVAL",
        "SIDECAR_QUORUM_FENCE_AFTER",
        "SIDECAR_VALKEY_TIMEOUT",
        "SIDECAR_LIVENESS_WINDOW",
        "SIDECAR_STALE_AFTER",
        "SIDECAR_MAX_LAG_BYTES",
        "SIDECAR_LOG_FORMAT",
    ] {
        assert!(
            help.contains(&format!("[env: {var}")),
            "{var} missing from --help"
        );
    }
}

#[test]
fn status_bad_usage_is_64_and_no_api_is_69() {
    let out = run(&[], &["status", "-o", "yaml"]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    // No kubeconfig and no in-cluster account: the API cannot be asked.
    let out = run(&[("KUBECONFIG", "/nonexistent")], &["status", "-n", "x"]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("valkey-sidecar status: "), "{stderr}");
}
