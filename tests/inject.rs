//! `valkey-sidecar inject` end to end: golden outputs, idempotence, byte-for-byte pass-through,
//! errors, and the injected manifests accepted by a real kube-apiserver (server-side dry-run).
//!
//! The golden outputs live beside their inputs in `tests/fixtures/inject/` (`<name>.injected.yaml`);
//! regenerate them with `UPDATE_GOLDEN=1 cargo test -p valkey-sidecar --test inject` and review
//! the diff.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use valkey_sidecar_testkit::k8s::{ControlPlane, ControlPlaneOptions};

/// A fixed image, so the goldens do not change with the crate's version.
const IMAGE: &str = "ghcr.io/valkey-sidecar/valkey-sidecar:dev";

/// Fixture name and the flags it is injected with (besides `--image`).
const CASES: &[(&str, &[&str])] = &[
    ("statefulset", &[]),
    ("deployment", &["--classic"]),
    ("list", &[]),
    ("stream", &[]),
    ("valkeycluster", &[]),
    ("valkeycluster-tls", &[]),
    (
        "pod",
        &[
            "--replace-probes",
            "--mode",
            "cluster",
            "--cluster-name",
            "scratch-cache",
            "--service-account",
            "valkey-agent",
            "--env",
            "SIDECAR_FAILBACK=true",
            "--env",
            "VALKEY_USERNAME=agent",
        ],
    ),
];

fn fixture(name: &str) -> PathBuf {
    valkey_sidecar_testkit::repo_root()
        .join("tests/fixtures/inject")
        .join(name)
}

fn golden(name: &str) -> PathBuf {
    fixture(&format!("{name}.injected.yaml"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs `valkey-sidecar inject <args>` with `stdin`.
fn inject(args: &[&str], stdin: &str) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_valkey-sidecar"));
    cmd.env_clear().arg("inject").args(args);
    run(cmd, stdin)
}

/// Runs `cmd` with `stdin` fed to it, collecting its output.
fn run(mut cmd: Command, stdin: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run valkey-sidecar inject");
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

fn case_args<'a>(flags: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["--image", IMAGE];
    args.extend_from_slice(flags);
    args
}

/// Injects `text` with `flags` and expects success.
fn injected(flags: &[&str], text: &str) -> String {
    let out = inject(&case_args(flags), text);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

fn stdout(out: &Output) -> &str {
    std::str::from_utf8(&out.stdout).unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The stream cut before every `---` line, as inject cuts it.
fn pieces(text: &str) -> Vec<&str> {
    let mut cuts = vec![0];
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if at > 0 && (line == "---\n" || line.starts_with("--- ")) {
            cuts.push(at);
        }
        at += line.len();
    }
    cuts.push(text.len());
    cuts.windows(2).map(|w| &text[w[0]..w[1]]).collect()
}

#[test]
fn injected_manifests_match_the_golden_files() {
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    for (name, flags) in CASES {
        let out = injected(flags, &read(&fixture(&format!("{name}.yaml"))));
        if update {
            std::fs::write(golden(name), &out).unwrap();
            continue;
        }
        assert_eq!(
            out,
            read(&golden(name)),
            "{name}: output differs from the golden file (UPDATE_GOLDEN=1 to regenerate)"
        );
    }
}

#[test]
fn injecting_twice_changes_nothing_and_check_says_so() {
    for (name, flags) in CASES {
        let once = read(&golden(name));
        assert_eq!(injected(flags, &once), once, "{name}: second injection");
        let mut check = case_args(flags);
        check.push("--check");
        let again = inject(&check, &once);
        assert_eq!(again.status.code(), Some(0), "{name}: {}", stderr(&again));
        assert_eq!(stdout(&again), "", "--check writes nothing");
        let first = inject(&check, &read(&fixture(&format!("{name}.yaml"))));
        assert_eq!(first.status.code(), Some(1), "{name}: {}", stderr(&first));
        assert_eq!(stdout(&first), "");
        assert!(
            stderr(&first).contains("would inject: stdin: document"),
            "{}",
            stderr(&first)
        );
    }
}

#[test]
fn documents_without_valkey_pass_through_byte_for_byte() {
    let input = read(&fixture("stream.yaml"));
    let output = injected(&[], &input);
    let (before, after) = (pieces(&input), pieces(&output));
    assert_eq!(before.len(), after.len());
    for (n, (b, a)) in before.iter().zip(&after).enumerate() {
        if b.contains("kind: StatefulSet") {
            // The rewritten document keeps its separator and the comments around it.
            assert!(a.starts_with("---\n# Source: chart/templates/statefulset.yaml\n"));
            assert!(a.ends_with("# the end of the chart\n...\n"));
        } else {
            assert_eq!(a, b, "piece {n} changed");
        }
    }
    // A stream with nothing to inject comes back identical, trailing blank lines and all.
    let plain: String = before
        .iter()
        .filter(|p| !p.contains("StatefulSet"))
        .copied()
        .collect();
    assert_eq!(injected(&[], &plain), plain);
}

#[test]
fn files_and_stdin_are_joined_into_one_stream() {
    let (sts, dep) = (fixture("statefulset.yaml"), fixture("deployment.yaml"));
    let out = inject(
        &[
            "--image",
            IMAGE,
            sts.to_str().unwrap(),
            "-",
            dep.to_str().unwrap(),
        ],
        "kind: ConfigMap\nmetadata: {name: x}",
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let expected = [
        read(&golden("statefulset")),
        "---\nkind: ConfigMap\nmetadata: {name: x}\n".to_owned(),
        "---\n".to_owned(),
        injected(&[], &read(&dep)),
    ];
    assert_eq!(stdout(&out), expected.concat());
}

#[test]
fn a_workload_without_valkey_fails_naming_the_document() {
    let input = read(&fixture("no-valkey.yaml"));
    let out = inject(&[], &input);
    assert_eq!(out.status.code(), Some(65));
    assert_eq!(stdout(&out), "", "no partial output");
    let err = stderr(&out);
    assert!(
        err.contains("stdin: document 2 (Deployment web): no Valkey container"),
        "{err}"
    );
    // With --ignore-missing it passes through as it was; the Pod is injected.
    let out = inject(&["--ignore-missing"], &input);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (before, after) = (pieces(&input), pieces(stdout(&out)));
    assert_eq!(&after[..2], &before[..2]);
    assert!(after[2].contains("name: valkey-sidecar"));
    // The same inside a List names the item.
    let list = format!(
        "kind: List\napiVersion: v1\nitems:\n{}",
        before[1].replace("---\n", "- ").replace("\n", "\n  ")
    );
    let err = stderr(&inject(&[], &list));
    assert!(
        err.contains("document 1 (List, item 1 (Deployment web)): no Valkey"),
        "{err}"
    );
}

#[test]
fn unparsable_yaml_fails_with_line_and_column() {
    let path = fixture("broken.yaml");
    let out = inject(&[path.to_str().unwrap()], "");
    assert_eq!(out.status.code(), Some(65));
    assert_eq!(stdout(&out), "");
    let err = stderr(&out);
    assert!(err.contains("broken.yaml:7:16: "), "{err}");
    // Lines count from the start of the stream, not of the document.
    let out = inject(
        &[],
        "kind: Service\n---\nkind: Pod\nspec: {containers: [}\n",
    );
    assert!(stderr(&out).contains("stdin:4:"), "{}", stderr(&out));
}

#[test]
fn bad_input_and_flags_have_their_own_exit_codes() {
    let out = inject(&["/nonexistent/manifest.yaml"], "");
    assert_eq!(out.status.code(), Some(66), "{}", stderr(&out));
    assert_eq!(inject(&["--env", "NOVALUE"], "").status.code(), Some(64));
    assert_eq!(inject(&["--mode", "sentinel"], "").status.code(), Some(64));
}

#[test]
fn the_default_image_is_this_version() {
    let out = inject(&[], &read(&fixture("statefulset.yaml")));
    let image = format!(
        "image: ghcr.io/valkey-sidecar/valkey-sidecar:{}\n",
        env!("CARGO_PKG_VERSION")
    );
    assert!(stdout(&out).contains(&image));
}

#[test]
fn the_charts_pods_with_the_agent_already_are_left_alone() {
    // What the chart renders (the pods every end-to-end test runs), native and classic sidecar.
    for example in ["cluster-3x1", "classic-sidecar"] {
        let rendered =
            valkey_sidecar_testkit::repo_root().join(format!("examples/rendered/{example}.yaml"));
        let rendered = read(&rendered);
        assert_eq!(injected(&[], &rendered), rendered, "{example}");
        assert_eq!(
            inject(&["--check"], &rendered).status.code(),
            Some(0),
            "{example}"
        );
    }
}

#[test]
fn warnings_say_what_was_adjusted() {
    let out = inject(&["--classic"], &read(&fixture("deployment.yaml")));
    let err = stderr(&out);
    assert!(
        err.contains(
            "terminationGracePeriodSeconds 10 leaves no time for the hand-over; raised to 30"
        ),
        "{err}"
    );
    assert!(
        err.contains("ServiceAccount sessions: it needs the chart's RBAC"),
        "{err}"
    );
    assert!(
        err.contains("Deployment sessions: SIDECAR_MODE=replication"),
        "{err}"
    );
    // A preStop hook of the user's own is kept, and said so.
    let pod = "kind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: valkey\n    image: valkey/valkey\n    lifecycle: {preStop: {exec: {command: [sleep, '5']}}}\n";
    let out = inject(&[], pod);
    assert!(stdout(&out).contains("preStop: {exec: {command: [sleep, '5']}}"));
    assert!(
        stderr(&out).contains("container valkey already has a preStop hook"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_sentinel_workload_is_refused_unless_forced() {
    let input = read(&fixture("sentinel.yaml"));
    let out = inject(&[], &input);
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    assert_eq!(stdout(&out), "", "no partial output");
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(
        err.contains("document 1 (StatefulSet cache-node): it runs Valkey Sentinel (container valkey sets VALKEY_SENTINEL_MASTER_NAME): Sentinel and the agent would both fail primaries over and fight; not injected (--force to inject anyway)"),
        "{err}"
    );
    // --ignore-missing is for workloads without Valkey: it does not wave a Sentinel through.
    assert_eq!(
        inject(&["--ignore-missing"], &input).status.code(),
        Some(65)
    );
    // Each sign alone is enough: the Sentinel container's image, once the env is gone.
    let image_only = input.replace("VALKEY_SENTINEL_MASTER_NAME", "VALKEY_PRIMARY_NAME");
    let err = stderr(&inject(&[], &image_only));
    assert!(
        err.contains("(container sentinel: image docker.io/bitnami/valkey-sentinel:8.1)"),
        "{err}"
    );
    // Forced: injected, with a warning.
    let out = inject(&["--force"], &input);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stdout(&out).contains("name: valkey-sidecar"));
    assert!(
        stderr(&out).contains("warning: StatefulSet cache-node: it runs Valkey Sentinel"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_valkey_cluster_gets_the_operators_tls_its_own_login_and_defers_to_the_operator() {
    let out = inject(&case_args(&[]), &read(&fixture("valkeycluster.yaml")));
    let (text, err) = (stdout(&out), stderr(&out));
    // Defers to the operator, by name.
    assert!(text.contains("- name: SIDECAR_COORDINATION\n          value: operator\n"));
    assert!(text.contains("- name: SIDECAR_OPERATOR_RESOURCE\n          value: orders\n"));
    // No TLS on the CR: none for the agent.
    assert!(!text.contains("VALKEY_TLS"), "{text}");
    // A user of its own, its password from the operator's default Secret and key.
    assert!(
        text.contains(
            "secretKeyRef:\n              name: orders-users\n              key: valkey-sidecar\n"
        ),
        "{text}"
    );
    assert!(
        err.contains("kubectl create secret generic orders-users --from-literal=valkey-sidecar="),
        "{err}"
    );
    // The ServiceAccount it runs as, and the RBAC for it.
    assert!(
        err.contains("its pods run as the namespace's `default` ServiceAccount"),
        "{err}"
    );
    assert!(err.contains("kubectl apply -n NAMESPACE -f -"), "{err}");
    assert!(
        err.contains("resources: [\"valkeyclusters\"]\n    verbs: [\"get\", \"list\", \"watch\"]"),
        "{err}"
    );
    // Two clusters in one stream: the RBAC is printed once.
    let two = format!(
        "{}---\n{}",
        read(&fixture("valkeycluster.yaml")),
        read(&fixture("valkeycluster.yaml")).replace("name: orders", "name: carts")
    );
    let err = stderr(&inject(&case_args(&[]), &two));
    assert_eq!(err.matches("kind: RoleBinding").count(), 1, "{err}");
    // `--env` still wins over what inject sets.
    let out = injected(
        &["--env", "SIDECAR_COORDINATION=agent"],
        &read(&fixture("valkeycluster.yaml")),
    );
    assert!(
        out.contains("- name: SIDECAR_COORDINATION\n          value: agent\n"),
        "{out}"
    );
    assert_eq!(out.matches("SIDECAR_COORDINATION").count(), 1);
}

#[test]
fn the_agents_acl_user_has_the_charts_rules_without_formation_and_with_config_set() {
    // The chart's agent user as rendered (cluster mode, forming its cluster).
    let rendered =
        read(&valkey_sidecar_testkit::repo_root().join("examples/rendered/cluster-3x1.yaml"));
    let start = rendered
        .find("- valkey-sidecar\n")
        .expect("the agent's user");
    let chart: Vec<&str> = rendered[start..]
        .lines()
        .map(|l| l.trim().trim_start_matches("- "))
        .skip_while(|w| !w.starts_with("resetkeys"))
        .take_while(|w| w.starts_with(['+', '#']) || *w == "-@all" || w.starts_with("reset"))
        .filter(|w| !w.starts_with('#'))
        .collect();
    let formation = [
        "+cluster|set-config-epoch",
        "+cluster|addslotsrange",
        "+cluster|meet",
        "+cluster|replicate",
        "+cluster|forget",
        "+cluster|reset",
    ];
    // The operator's pods have no valkey-settings container: the agent sets the zone itself, as
    // the chart's agent does with `sidecar.settings.enabled=false`.
    let mut expected: Vec<&str> = chart
        .iter()
        .copied()
        .filter(|w| !formation.contains(w))
        .collect();
    assert!(
        !expected.contains(&"+config|set"),
        "the settings container's: {chart:?}"
    );
    let at = expected
        .iter()
        .position(|w| *w == "+client|setinfo")
        .unwrap()
        + 1;
    expected.insert(at, "+config|set");
    assert!(expected.contains(&"+cluster|failover"), "{chart:?}");
    let out = injected(&[], &read(&fixture("valkeycluster.yaml")));
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("permissions:"))
        .expect("permissions");
    let ours: Vec<&str> = line
        .split_once(':')
        .unwrap()
        .1
        .trim()
        .trim_matches('"')
        .split(' ')
        .collect();
    assert_eq!(ours, expected);
}

#[test]
fn the_valkey_container_can_be_named() {
    let pod = "kind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - {name: exporter, image: valkey-io/exporter}\n  - {name: db, image: example/kv, args: [--port, '7001']}\n";
    let out = injected(&["--container", "db"], pod);
    assert!(
        out.contains(
            "- name: db\n    image: example/kv\n    args: [--port, '7001']\n    startupProbe:"
        ),
        "{out}"
    );
    assert!(out.contains("value: \"127.0.0.1:7001\""), "{out}");
    // Without it: the exporter's image says valkey, but an exporter is not the server.
    let err = stderr(&inject(&[], pod));
    assert!(
        err.contains("document 1 (Pod p): no Valkey container"),
        "{err}"
    );
    let err = stderr(&inject(&["--container", "nope"], pod));
    assert!(
        err.contains("document 1 (Pod p): no Valkey container"),
        "{err}"
    );
}

#[test]
fn documents_sharing_a_piece_cannot_be_rewritten_alone() {
    let text = "kind: Service\n...\nkind: Pod\nmetadata: {name: a}\nspec: {containers: [{name: valkey, image: v}]}\n";
    let out = inject(&[], text);
    assert_eq!(out.status.code(), Some(65));
    assert!(
        stderr(&out).contains("stdin: document 2: several documents without `---` between them")
    );
    // Nothing to change in them: fine, and untouched.
    let text = "kind: Service\n...\nkind: ConfigMap\n";
    assert_eq!(injected(&[], text), text);
}

/// Runs kubectl; panics with its stderr when it fails.
async fn kubectl(plane: &ControlPlane, args: &[&str]) -> String {
    plane
        .kubectl(args)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_manifests_pass_a_server_side_dry_run() {
    let plane = ControlPlane::start(ControlPlaneOptions::apiserver_only())
        .await
        .unwrap();
    // Pods are checked against their ServiceAccount; templates are not.
    for account in ["valkey-sidecar", "valkey-agent"] {
        kubectl(&plane, &["create", "serviceaccount", account]).await;
    }
    for (name, _) in CASES
        .iter()
        .filter(|(n, _)| !n.starts_with("valkeycluster"))
    {
        let path = golden(name);
        let out = kubectl(
            &plane,
            &["apply", "--dry-run=server", "-f", path.to_str().unwrap()],
        )
        .await;
        println!("{name}: {}", out.trim());
    }

    // What the apiserver reads from a re-serialised document is what it read before: YAML 1.1's
    // octal `0644` and the quoted "yes" survive.
    let path = golden("statefulset");
    let json = kubectl(
        &plane,
        &[
            "create",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            path.to_str().unwrap(),
        ],
    )
    .await;
    let sts: Value = serde_json::from_str(&json).unwrap();
    let pod = &sts["spec"]["template"]["spec"];
    assert_eq!(pod["volumes"][0]["configMap"]["defaultMode"], 420);
    assert_eq!(pod["containers"][0]["args"][2], "yes");
    assert_eq!(pod["initContainers"][0]["restartPolicy"], "Always");
    assert_eq!(
        pod["containers"][0]["lifecycle"]["preStop"]["httpGet"]["port"],
        9736
    );
    // The API token as the chart hands it out: to the agent alone.
    let chart = chart_statefulset(&plane).await;
    let chart_pod = &chart["spec"]["template"]["spec"];
    assert_eq!(token_handling(pod), token_handling(chart_pod));
    assert_eq!(token_handling(pod).2, ["valkey-sidecar"]);

    valkey_cluster_dry_run(&plane).await;
}

/// The first StatefulSet of the chart's rendered `cluster-3x1` example, as the apiserver stores it.
async fn chart_statefulset(plane: &ControlPlane) -> Value {
    let root = valkey_sidecar_testkit::repo_root();
    let rendered = read(&root.join("examples/rendered/cluster-3x1.yaml"));
    let docs = valkey_sidecar_testkit::k8s::chart::documents(&rendered);
    let sts = docs
        .into_iter()
        .find(|d| valkey_sidecar_testkit::k8s::chart::kind_of(d) == Some("StatefulSet"))
        .expect("a StatefulSet");
    let path = plane.dir().join("chart-statefulset.yaml");
    std::fs::write(&path, sts.replace("\n  namespace: valkey\n", "\n")).unwrap();
    let args = ["create", "--dry-run=server", "-o", "json", "-f"];
    let json = kubectl(plane, &[&args[..], &[path.to_str().unwrap()]].concat()).await;
    serde_json::from_str(&json).unwrap()
}

/// How a pod spec hands out the API token: the automount setting, the sources of the projected
/// volume that carries a token, and the containers that mount it where clients look for it.
fn token_handling(pod: &Value) -> (Value, Value, Vec<String>) {
    let path = "/var/run/secrets/kubernetes.io/serviceaccount";
    let volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
    let token = volumes.iter().find(|v| {
        let sources = v["projected"]["sources"].as_array();
        sources.is_some_and(|s| s.iter().any(|s| s.get("serviceAccountToken").is_some()))
    });
    let name = token.map(|v| v["name"].clone()).unwrap_or(Value::Null);
    let containers = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod[*k].as_array().cloned().unwrap_or_default());
    let mounting = containers
        .filter(|c| {
            let mounts = c["volumeMounts"].as_array().cloned().unwrap_or_default();
            mounts
                .iter()
                .any(|m| m["mountPath"] == path && m["name"] == name)
        })
        .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    let sources = token.map_or(Value::Null, |v| v["projected"]["sources"].clone());
    (
        pod["automountServiceAccountToken"].clone(),
        sources,
        mounting,
    )
}

/// The ValkeyClusters against valkey-operator's published CRD with strict field validation (a field
/// inject writes that the operator's API lacks fails), then the containers each carries merged the
/// way the operator merges them (`server` patched, the rest appended) and dry-run as a Pod with the
/// operator's volumes; the RBAC inject prints, applied and checked with `auth can-i`.
async fn valkey_cluster_dry_run(plane: &ControlPlane) {
    let crd = fixture("valkeycluster-crd.yaml");
    kubectl(plane, &["apply", "-f", crd.to_str().unwrap()]).await;
    plane
        .wait_crd_established("valkeyclusters.valkey.io", Duration::from_secs(30))
        .await
        .unwrap();
    kubectl(plane, &["create", "namespace", "shop"]).await;
    // The operator's pods run as `default` (no controller here makes it).
    for ns in ["default", "shop"] {
        kubectl(plane, &["create", "serviceaccount", "default", "-n", ns]).await;
    }
    for name in ["valkeycluster", "valkeycluster-tls"] {
        let cluster = strict_dry_run(plane, &read(&golden(name)))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        operator_pod_dry_run(plane, name, &cluster).await;
    }
    a_field_the_crd_lacks_is_rejected(plane).await;
    the_printed_rbac_grants_the_default_account(plane).await;
}

/// `kubectl create --dry-run=server --validate=strict` of `manifest`: the object as stored.
async fn strict_dry_run(plane: &ControlPlane, manifest: &str) -> Result<Value, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manifest.yaml");
    std::fs::write(&path, manifest).unwrap();
    let args = [
        "create",
        "--dry-run=server",
        "--validate=strict",
        "-o",
        "json",
    ];
    let path = path.to_str().unwrap();
    let json = plane
        .kubectl(&[&args[..], &["-f", path]].concat())
        .await
        .map_err(|e| format!("{e:#}"))?;
    serde_json::from_str(&json).map_err(|e| e.to_string())
}

/// The check can fail: the golden with one field the operator's types lack is refused, naming it.
async fn a_field_the_crd_lacks_is_rejected(plane: &ControlPlane) {
    let golden = read(&golden("valkeycluster-tls"));
    let bogus = [
        // In the agent's container (corev1.Container has no such field).
        (
            "      volumeMounts:\n",
            "      restartPolicyy: Always\n      volumeMounts:\n",
            "spec.containers[1].restartPolicyy",
        ),
        // In a user (UserAclSpec).
        (
            "        keys: [default]\n",
            "        keys: [default]\n      password: plain\n",
            "spec.users[0].password",
        ),
    ];
    for (at, with, field) in bogus {
        assert!(golden.contains(at), "{at:?} not in the golden");
        let manifest = golden.replacen(at, with, 1);
        let err = strict_dry_run(plane, &manifest).await.err();
        let err = err.unwrap_or_else(|| panic!("{field} was accepted"));
        assert!(
            err.contains(&format!("unknown field \"{field}\"")),
            "{field}: {err}"
        );
    }
}

/// The containers of a stored ValkeyCluster merged onto the operator's `server` container
/// (internal/controller/valkeynode_resources.go: its image, command and volumes) and dry-run as
/// a Pod.
async fn operator_pod_dry_run(plane: &ControlPlane, name: &str, cluster: &Value) {
    let mut containers = cluster["spec"]["containers"].as_array().unwrap().clone();
    assert_eq!(containers[0]["name"], "server");
    containers[0]["image"] = json!("valkey/valkey:9.1.2");
    containers[0]["command"] = json!(["valkey-server", "/config/valkey.conf"]);
    let mut volumes = vec![json!({ "name": "data", "emptyDir": {} })];
    let tls = &cluster["spec"]["networking"]["tls"]["certificates"]["server"]["secretName"];
    if let Some(secret) = tls.as_str() {
        volumes.push(json!({ "name": "tls-certs", "secret": { "secretName": secret } }));
    }
    let namespace = cluster["metadata"]["namespace"]
        .as_str()
        .unwrap_or("default");
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": "node-0-0", "namespace": namespace,
            "labels": { "valkey.io/cluster": cluster["metadata"]["name"] },
        },
        "spec": { "containers": containers, "volumes": volumes },
    });
    let stored = strict_dry_run(plane, &pod.to_string())
        .await
        .unwrap_or_else(|e| panic!("{name} as a Pod: {e}"));
    println!("{name}: merged into a Pod, accepted");
    let agent = &stored["spec"]["containers"][1];
    assert_eq!(agent["name"], "valkey-sidecar");
}

/// The RBAC printed on stderr, applied: the namespace's `default` ServiceAccount (the operator's
/// pods' account) may do what the agent does, and nothing it does not.
async fn the_printed_rbac_grants_the_default_account(plane: &ControlPlane) {
    let out = inject(&case_args(&[]), &read(&fixture("valkeycluster-tls.yaml")));
    let rbac = printed_rbac(&stderr(&out));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rbac.yaml");
    std::fs::write(&path, &rbac).unwrap();
    kubectl(plane, &["apply", "-f", path.to_str().unwrap()]).await;
    let can = |verb: &'static str, resource: &'static str| async move {
        let args = [
            "auth",
            "can-i",
            verb,
            resource,
            "-n",
            "shop",
            "--as",
            "system:serviceaccount:shop:default",
        ];
        // `no` exits 1: the answer is on stdout either way.
        match plane.kubectl(&args).await {
            Ok(out) => out.trim().to_owned(),
            Err(e) => format!("{e:#}"),
        }
    };
    for (verb, resource) in [
        ("watch", "valkeyclusters.valkey.io"),
        ("get", "valkeyclusters.valkey.io"),
        ("patch", "pods"),
        ("update", "leases.coordination.k8s.io"),
        ("create", "events"),
        ("get", "serviceaccounts/default"),
    ] {
        assert_eq!(can(verb, resource).await, "yes", "{verb} {resource}");
    }
    for (verb, resource) in [("update", "valkeyclusters.valkey.io"), ("get", "secrets")] {
        assert_ne!(can(verb, resource).await, "yes", "{verb} {resource}");
    }
}

/// The YAML block inject printed on stderr (between its comment line and the next message).
fn printed_rbac(stderr: &str) -> String {
    let lines = stderr
        .lines()
        .skip_while(|l| !l.starts_with("# The valkey-sidecar agent's RBAC"))
        .take_while(|l| !l.starts_with("valkey-sidecar inject:"));
    let block: String = lines.map(|l| format!("{l}\n")).collect();
    assert!(block.contains("kind: RoleBinding"), "no RBAC in: {stderr}");
    block
}

/// Runs `valkey-sidecar inject` on `stdin` with its address space capped at 512 MiB, so an input
/// that made it allocate without bound would kill it rather than pass.
fn inject_bounded(stdin: &str) -> Output {
    let mut cmd = Command::new("prlimit");
    cmd.args(["--as=536870912", "--"])
        .arg(env!("CARGO_BIN_EXE_valkey-sidecar"))
        .env_clear()
        .arg("inject");
    run(cmd, stdin)
}

#[test]
fn an_alias_bomb_and_deep_nesting_get_a_clear_error_in_bounded_memory() {
    // The "billion laughs": ten levels of ten aliases, 10^10 nodes if expanded.
    let mut bomb = String::from("kind: Pod\na0: &a0 [lol]\n");
    for k in 1..=10 {
        let refs = vec![format!("*a{}", k - 1); 10].join(", ");
        bomb.push_str(&format!("a{k}: &a{k} [{refs}]\n"));
    }
    let out = inject_bounded(&bomb);
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    assert_eq!(stdout(&out), "");
    assert!(
        stderr(&out).contains("aliases expand to more than 1000000 nodes"),
        "{}",
        stderr(&out)
    );
    // 10,000 levels of nesting, block and flow.
    let block = format!("kind: Pod\nspec:\n{}x\n", "- ".repeat(10_000));
    let out = inject_bounded(&block);
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("stdin:3:255: nested deeper than 128 levels"),
        "{}",
        stderr(&out)
    );
    let flow = format!(
        "kind: Pod\nspec: {}{}\n",
        "[".repeat(10_000),
        "]".repeat(10_000)
    );
    let out = inject_bounded(&flow);
    assert_eq!(out.status.code(), Some(65), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("stdin:2:262: recursion limit exceeded"),
        "{}",
        stderr(&out)
    );
}
