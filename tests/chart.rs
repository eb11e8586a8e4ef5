//! The Helm chart (`charts/valkey-sidecar`): `helm lint`, the examples rendered and committed under
//! `examples/rendered/` (regenerate with `UPDATE_RENDERED=1 cargo test --test chart` and review
//! the diff), values the schema or the templates refuse, and every rendered object accepted by a
//! real kube-apiserver (server-side dry-run) — with the pod template held against what
//! `valkey-sidecar inject` adds and the disruption budgets held against each other.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{Value, json};
use valkey_sidecar_testkit::k8s::chart::{
    CLUSTER_SCOPED_KINDS, chart_dir, documents, kind_of, lint, render,
};
use valkey_sidecar_testkit::k8s::{ControlPlane, ControlPlaneOptions, helm_bin};

const RELEASE: &str = "valkey";
const NS: &str = "valkey";
const ROLE: &str = "valkey.io/role";

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// `examples/*.yaml` by name (without the extension).
fn examples() -> Vec<(String, PathBuf)> {
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(examples_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| (p.file_stem().unwrap().to_string_lossy().into_owned(), p))
        .collect();
    out.sort();
    assert!(out.len() >= 5, "examples: {out:?}");
    out
}

fn rendered_path(name: &str) -> PathBuf {
    examples_dir().join("rendered").join(format!("{name}.yaml"))
}

fn render_example(path: &Path) -> String {
    render(RELEASE, NS, &[path.to_path_buf()], &[]).unwrap_or_else(|e| panic!("{e:#}"))
}

fn render_sets(sets: &[&str]) -> Result<String, String> {
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    render(RELEASE, NS, &[], &sets).map_err(|e| format!("{e:#}"))
}

#[test]
fn lint_is_clean_for_the_defaults_and_every_example() {
    lint(&[]).unwrap_or_else(|e| panic!("{e:#}"));
    for (name, path) in examples() {
        lint(&[path]).unwrap_or_else(|e| panic!("{name}: {e:#}"));
    }
}

#[test]
fn rendered_examples_are_up_to_date() {
    let update = std::env::var_os("UPDATE_RENDERED").is_some();
    let names: Vec<String> = examples().into_iter().map(|(n, _)| n).collect();
    for (name, path) in examples() {
        let rendered = render_example(&path);
        let committed = rendered_path(&name);
        if update {
            std::fs::create_dir_all(committed.parent().unwrap()).unwrap();
            std::fs::write(&committed, &rendered).unwrap();
            continue;
        }
        let before = std::fs::read_to_string(&committed).unwrap_or_default();
        assert!(
            before == rendered,
            "{} is stale: regenerate with UPDATE_RENDERED=1 cargo test --test chart \
             and review the diff",
            committed.display()
        );
    }
    // No rendering of an example that is gone.
    for entry in std::fs::read_dir(examples_dir().join("rendered")).unwrap() {
        let path = entry.unwrap().path();
        let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(names.contains(&stem), "{} has no example", path.display());
    }
}

#[test]
fn values_the_chart_refuses() {
    let cases: &[(&[&str], &str)] = &[
        (&["mode=sentinel"], "schema"),
        (&["shards=0"], "schema"),
        (&["sidecar.labels.role=role"], "schema"),
        (&["sidecar.mode=sidecar"], "schema"),
        (&["spread.zone.mode=Sometimes"], "schema"),
        (&["terminationGracePeriodSeconds=10"], "schema"),
        (
            &["clusterName=a-name-that-is-much-longer-than-forty-chars"],
            "schema",
        ),
        (&["persistance.enabled=true"], "schema"),
        (&["pdb.primaries=true", "replicas=1"], "replicas >= 2"),
        (&["tls.enabled=true"], "tls.existingSecret is required"),
        (
            &[
                "tls.enabled=true",
                "tls.existingSecret=t",
                "tls.authClients=yes",
            ],
            "tls.agentExistingSecret is required",
        ),
        (
            &["sidecar.env.SIDECAR_MODE=replication"],
            "sets it from its own values",
        ),
        (
            &["sidecar.env.VALKEY_TLS=true"],
            "sets it from its own values",
        ),
        (&["placement.zonePinning=Sometimes"], "schema"),
        (&["spread.primaries=Required"], "schema"),
        (
            &[
                "placement.zones={zone-a}",
                "nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key=x",
            ],
            "leave nodeAffinity empty",
        ),
        (
            &["sidecar.env.SIDECAR_CLUSTER_SHARDS=4"],
            "sets it from its own values",
        ),
    ];
    for (sets, why) in cases {
        let err = render_sets(sets).expect_err(&format!("{sets:?} rendered"));
        assert!(err.contains(why), "{sets:?}: {err}");
    }
}

#[test]
fn without_valkey_only_the_agents_permissions_are_rendered() {
    let out = render_sets(&["valkey.enabled=false"]).unwrap();
    let mut kinds: Vec<&str> = documents(&out).iter().filter_map(|d| kind_of(d)).collect();
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Role",
            "RoleBinding",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "ValidatingAdmissionPolicyBinding",
        ]
    );
}

#[test]
fn valkey_reloads_rotated_certificates_where_its_version_can() {
    // `tls-auto-reload-interval` is Valkey 9.1's: an older image would refuse to start with it.
    for (tag, reloads) in [
        ("9.1.2", true),
        ("9.1.2-alpine", true),
        ("8.1-alpine", false),
    ] {
        let set = format!("valkey.image.tag={tag}");
        let sets = ["tls.enabled=true", "tls.existingSecret=t", set.as_str()];
        let out = render_sets(&sets).unwrap();
        assert_eq!(out.contains("--tls-auto-reload-interval"), reloads, "{tag}");
    }
    let off = render_sets(&[
        "tls.enabled=true",
        "tls.existingSecret=t",
        "tls.autoReloadInterval=0",
    ]);
    assert!(!off.unwrap().contains("--tls-auto-reload-interval"));
}

/// `helm template` with `--api-versions` for each of `apis` (as GitOps tools pass the target
/// cluster's) and `--set`s.
fn render_for(apis: &[&str], sets: &[&str]) -> String {
    let mut args: Vec<String> = ["template", RELEASE, chart_dir().to_str().unwrap(), "-n", NS]
        .map(String::from)
        .to_vec();
    for api in apis {
        args.extend(["--api-versions".into(), api.to_string()]);
    }
    for set in sets {
        args.extend(["--set".into(), set.to_string()]);
    }
    valkey_sidecar_testkit::k8s::chart::helm(&args).unwrap_or_else(|e| panic!("{e:#}"))
}

fn kinds(rendered: &str) -> Vec<String> {
    documents(rendered)
        .iter()
        .filter_map(|d| kind_of(d).map(str::to_owned))
        .collect()
}

const MAP: &str = "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy";
const OPENSHIFT: &str = "security.openshift.io/v1";

/// GitOps tools render with `helm template` at every sync: two renders of the same values must be
/// the same manifests, and no render may hold a password (a generated one would differ each time
/// and replace the one in use). The chart's credentials Job makes them in the cluster instead.
#[test]
fn renders_are_reproducible_and_hold_no_password() {
    let mut cases: Vec<(String, Vec<String>)> = VARIANTS
        .iter()
        .map(|(n, sets)| (n.to_string(), sets.iter().map(|s| s.to_string()).collect()))
        .collect();
    for rotation in ["accept", "promote"] {
        cases.push((rotation.into(), vec![format!("auth.rotation={rotation}")]));
    }
    for (name, sets) in &cases {
        let first = render(RELEASE, NS, &[], sets).unwrap();
        let second = render(RELEASE, NS, &[], sets).unwrap();
        assert!(first == second, "{name}: two renders differ");
        assert!(
            !kinds(&first).iter().any(|k| k == "Secret"),
            "{name}: a Secret in the render"
        );
    }
    for (name, path) in examples() {
        assert_eq!(render_example(&path), render_example(&path), "{name}");
    }
    // The Job: one per rotation step (its template, so its name, changes), none without it.
    let job = |sets: &[&str]| {
        let out = render_sets(sets).unwrap();
        let doc = documents(&out)
            .into_iter()
            .find(|d| kind_of(d) == Some("Job"));
        doc.map(|d| {
            d.lines()
                .find(|l| l.starts_with("  name:"))
                .unwrap()
                .to_owned()
        })
    };
    let plain = job(&[]).expect("the credentials Job");
    assert!(plain.contains("valkey-credentials-"), "{plain}");
    assert_ne!(job(&["auth.rotation=accept"]), Some(plain.clone()));
    assert_eq!(job(&["auth.existingSecret=mine"]), None);
    assert_eq!(job(&["auth.enabled=false"]), None);
}

/// MutatingAdmissionPolicy v1 exists from Kubernetes 1.36: the chart renders its policies only
/// where the API serves it (`helm install`: discovery; `helm template`: `--api-versions`), and
/// only in the cluster profile.
#[test]
fn mutating_policies_render_only_where_the_api_serves_them() {
    let zones = "placement.zones={zone-a,zone-b}";
    let map_kinds = |k: Vec<String>| k.iter().filter(|k| k.starts_with("Mutating")).count();
    assert_eq!(
        map_kinds(kinds(&render_for(&[], &[zones]))),
        0,
        "no API, no policy"
    );
    assert_eq!(map_kinds(kinds(&render_for(&[MAP], &[]))), 2, "node-index");
    assert_eq!(
        map_kinds(kinds(&render_for(&[MAP], &[zones]))),
        4,
        "node-index and zones"
    );
    let off = ["nodeIndex.admissionPolicy=false", zones];
    assert_eq!(map_kinds(kinds(&render_for(&[MAP], &off))), 2, "zones only");
    let namespace = ["profile=namespace", zones];
    assert_eq!(
        map_kinds(kinds(&render_for(&[MAP], &namespace))),
        0,
        "namespace profile"
    );
}

/// The install profiles: `namespace` renders nothing cluster-scoped (unless a value asks for it),
/// `restricted` and OpenShift fix no user, group or fsGroup; DNS egress includes OpenShift's port.
#[test]
fn install_profiles() {
    let cluster_scoped = |out: &str| -> Vec<String> {
        kinds(out)
            .into_iter()
            .filter(|k| CLUSTER_SCOPED_KINDS.contains(&k.as_str()))
            .collect()
    };
    let zones = "placement.zones={zone-a,zone-b}";
    assert_eq!(cluster_scoped(&render_for(&[MAP], &[])).len(), 8);
    for profile in ["namespace", "restricted"] {
        let set = format!("profile={profile}");
        let out = render_for(&[MAP, OPENSHIFT], &[&set, zones]);
        assert_eq!(cluster_scoped(&out), Vec::<String>::new(), "{profile}");
    }
    let nodes = render_for(&[], &["profile=namespace", "sidecar.readNodes=true"]);
    assert_eq!(
        cluster_scoped(&nodes),
        ["ClusterRole", "ClusterRoleBinding"]
    );
    let fixed = |out: &str| ["runAsUser", "runAsGroup", "fsGroup:"].map(|k| out.contains(k));
    assert_eq!(
        fixed(&render_for(&[], &[])),
        [true; 3],
        "the cluster profile: the image's ids"
    );
    assert_eq!(fixed(&render_for(&[], &["profile=restricted"])), [false; 3]);
    assert_eq!(
        fixed(&render_for(&[OPENSHIFT], &[])),
        [false; 3],
        "OpenShift assigns them"
    );
    let policy = render_for(&[], &[]);
    let policy = documents(&policy)
        .into_iter()
        .find(|d| kind_of(d) == Some("NetworkPolicy"))
        .unwrap();
    assert!(
        policy.contains("port: 53\n") && policy.contains("port: 5353\n"),
        "{policy}"
    );
}

/// Variants beyond the examples: the defaults and the switches the examples leave alone.
const VARIANTS: &[(&str, &[&str])] = &[
    ("defaults", &[]),
    ("rbac-only", &["valkey.enabled=false"]),
    (
        "replication-3-shards",
        &[
            "mode=replication",
            "shards=3",
            "replicas=2",
            "pdb.primaries=true",
        ],
    ),
    ("no-auth", &["auth.enabled=false", "service.read=false"]),
    (
        "no-spread",
        &[
            "spread.node.mode=Disabled",
            "spread.zone.mode=Disabled",
            "spread.clusterNode=Disabled",
            "spread.primaries=Disabled",
        ],
    ),
    (
        "regions-and-pinned-zones",
        &[
            "spread.region.mode=Preferred",
            "placement.zones={zone-a,zone-b,zone-c}",
            "placement.zonePinning=Required",
        ],
    ),
    (
        "caps-preferred",
        &["replicas=4", "spread.zone.maxPerDomain=2"],
    ),
    (
        "tls-no-client-certs",
        &[
            "tls.enabled=true",
            "tls.existingSecret=t",
            "persistence.emptyDirSizeLimit=2Gi",
        ],
    ),
    ("one-shard-primaries", &["shards=1", "pdb.primaries=true"]),
    (
        "no-node-index-policy",
        &[
            "nodeIndex.admissionPolicy=false",
            "sidecar.admissionPolicy=false",
            "sidecar.readNodes=false",
            "sidecar.env.SIDECAR_COORDINATOR=false",
        ],
    ),
];

async fn kubectl(plane: &ControlPlane, args: &[&str]) -> String {
    plane
        .kubectl(args)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// The objects of `rendered` as the apiserver would store them (server-side dry run).
async fn dry_run(plane: &ControlPlane, dir: &Path, name: &str, rendered: &str) -> Vec<Value> {
    let file = dir.join(format!("{name}.yaml"));
    std::fs::write(&file, rendered).unwrap();
    let out = kubectl(
        plane,
        &[
            "apply",
            "--dry-run=server",
            "-o",
            "json",
            "-f",
            file.to_str().unwrap(),
        ],
    )
    .await;
    let v: Value = serde_json::from_str(&out).unwrap();
    match v["kind"].as_str() {
        Some("List") => v["items"].as_array().unwrap().clone(),
        _ => vec![v],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_objects_pass_a_server_side_dry_run() {
    let plane = ControlPlane::start(ControlPlaneOptions::apiserver_only())
        .await
        .unwrap();
    kubectl(&plane, &["create", "namespace", NS]).await;
    // `helm test`'s pod names the agents' ServiceAccount, which pod admission wants to exist even
    // in a dry run (in a real `helm test` the release made it).
    kubectl(
        &plane,
        &["create", "serviceaccount", "valkey-sidecar", "-n", NS],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut rendered: Vec<(String, String)> = examples()
        .into_iter()
        .map(|(name, path)| (name, render_example(&path)))
        .collect();
    for (name, sets) in VARIANTS {
        rendered.push((name.to_string(), render_sets(sets).unwrap()));
    }
    let mut all = BTreeMap::new();
    for (name, text) in &rendered {
        let objects = dry_run(&plane, dir.path(), name, text).await;
        assert_eq!(objects.len(), documents(text).len(), "{name}");
        check_pods(name, &objects);
        check_budgets(name, &objects);
        check_services(name, &objects);
        check_network_policy(name, &objects);
        println!("{name}: {} objects accepted", objects.len());
        all.insert(name.clone(), objects);
    }

    // Not a release's: `helm install --dry-run` below would refuse to adopt it.
    kubectl(
        &plane,
        &["delete", "serviceaccount", "valkey-sidecar", "-n", NS],
    )
    .await;

    // Shapes the examples promise.
    let sts = |name: &str| -> Vec<Value> { of_kind(&all[name], "StatefulSet") };
    assert_eq!(sts("cluster-3x1").len(), 3);
    assert!(
        sts("cluster-3x1")
            .iter()
            .all(|s| s["spec"]["replicas"] == 2)
    );
    assert_eq!(sts("replication-1x2").len(), 1);
    assert_eq!(sts("replication-1x2")[0]["spec"]["replicas"], 3);
    assert_eq!(sts("tiny")[0]["spec"]["replicas"], 1);
    assert!(of_kind(&all["tiny"], "PodDisruptionBudget").is_empty());
    assert_eq!(of_kind(&all["production"], "PodDisruptionBudget").len(), 4);
    let claims = &sts("production")[0]["spec"]["volumeClaimTemplates"];
    assert_eq!(
        claims[0]["spec"]["resources"]["requests"]["storage"],
        "20Gi"
    );
    let tls_args = container(&sts("tls")[0], "valkey")["args"].to_string();
    assert!(tls_args.contains("\"--tls-cluster\",\"yes\""), "{tls_args}");
    assert!(tls_args.contains("\"--port\",\"0\""), "{tls_args}");
    let classic = pod_spec(&sts("classic-sidecar")[0]).clone();
    // Classic mode: the agent is a regular container; the only init container installs `await`.
    let inits = classic["initContainers"].as_array().unwrap();
    let names: Vec<&Value> = inits.iter().map(|c| &c["name"]).collect();
    assert_eq!(names, [&json!("install-await")]);
    let caps = pod_spec(&sts("spread-caps")[0]).clone();
    assert_eq!(caps["topologySpreadConstraints"][0]["minDomains"], 5);
    assert_eq!(caps["topologySpreadConstraints"][0]["maxSkew"], 2);
    let no_spread = pod_spec(&sts("no-spread")[0]).clone();
    assert!(no_spread["affinity"].is_null() && no_spread["topologySpreadConstraints"].is_null());
    // One pair of Services per replication shard.
    let services: Vec<String> = of_kind(&all["replication-3-shards"], "Service")
        .iter()
        .map(|s| s["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        services.contains(&"valkey-2".to_owned()) && services.contains(&"valkey-2-read".to_owned())
    );

    // What `helm install` prints (rendered against this apiserver, nothing created).
    let notes = helm_install_dry_run(
        &plane,
        &["-f", example_path("cluster-3x1").to_str().unwrap()],
    );
    for want in [
        "kubectl get pods -n valkey -l valkey.io/cluster=valkey -L valkey.io/role,valkey.io/shard-id,valkey.io/zone",
        "kubectl describe lease -n valkey valkey-coordinator",
        "The agents form the Valkey Cluster once every pod answers",
    ] {
        assert!(notes.contains(want), "NOTES lack {want:?}:\n{notes}");
    }
    assert!(!notes.contains("cluster addslotsrange"), "{notes}");
    // Forming it by hand is documented for formCluster=false.
    let manual = helm_install_dry_run(
        &plane,
        &[
            "-f",
            example_path("cluster-3x1").to_str().unwrap(),
            "--set",
            "formCluster=false",
        ],
    );
    for want in [
        "cli valkey-2-0 cluster addslotsrange 10922 16383",
        "cli valkey-0-0 cluster meet $(ip valkey-2-1) 6379",
        "cli valkey-1-1 cluster replicate $(cli valkey-1-0 cluster myid",
    ] {
        assert!(manual.contains(want), "NOTES lack {want:?}:\n{manual}");
    }
    let notes = helm_install_dry_run(
        &plane,
        &[
            "--set",
            "mode=replication",
            "--set",
            "sidecar.readNodes=false",
        ],
    );
    assert!(
        notes.contains("Nodes are not read (profile or sidecar.readNodes)"),
        "{notes}"
    );
    assert!(!notes.contains("addslotsrange"), "{notes}");
    // MutatingAdmissionPolicy v1 is served from 1.36 (the default plane, 1.37); helm learns it by
    // discovery, and says so where it is missing (scripts/test-k8s-version.sh 1.33).
    let version = plane.client().apiserver_version().await.unwrap();
    let served = version.minor.parse::<u32>().unwrap() >= 36;
    assert_eq!(
        notes.contains("kind: MutatingAdmissionPolicy\n"),
        served,
        "{notes}"
    );
    let missing = notes.contains("Pods carry no valkey.io/node-index");
    assert_eq!(missing, !served, "{notes}");

    matches_inject(&plane, dir.path(), &sts("cluster-3x1")[0]).await;
    matches_inject(&plane, dir.path(), &sts("classic-sidecar")[0]).await;
}

fn example_path(name: &str) -> PathBuf {
    examples_dir().join(format!("{name}.yaml"))
}

/// `helm install --dry-run=server` against `plane`: the manifests and NOTES helm would print.
fn helm_install_dry_run(plane: &ControlPlane, args: &[&str]) -> String {
    let out = Command::new(helm_bin().unwrap())
        .args([
            "install",
            RELEASE,
            chart_dir().to_str().unwrap(),
            "-n",
            NS,
            "--dry-run=server",
        ])
        .arg("--kubeconfig")
        .arg(plane.kubeconfig_path())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn of_kind(objects: &[Value], kind: &str) -> Vec<Value> {
    objects
        .iter()
        .filter(|o| o["kind"] == kind)
        .cloned()
        .collect()
}

fn pod_spec(sts: &Value) -> &Value {
    &sts["spec"]["template"]["spec"]
}

fn container<'a>(sts: &'a Value, name: &str) -> &'a Value {
    let spec = pod_spec(sts);
    ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec[k].as_array())
        .flatten()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn http_get(path: &str) -> Value {
    json!({ "path": path, "port": 9736, "scheme": "HTTP" })
}

/// Every pod template: the agent beside Valkey, probes and the preStop wait on Valkey pointing at
/// the agent's numeric port, hardened security contexts, the static labels the budgets and spread
/// rules select.
fn check_pods(name: &str, objects: &[Value]) {
    for sts in of_kind(objects, "StatefulSet") {
        let sts_name = sts["metadata"]["name"].as_str().unwrap();
        let spec = pod_spec(&sts);
        let labels = &sts["spec"]["template"]["metadata"]["labels"];
        let shard = sts_name.rsplit('-').next().unwrap();
        assert_eq!(labels["valkey.io/shard-index"], shard, "{name}/{sts_name}");
        assert_eq!(labels["valkey.io/cluster"], "valkey", "{name}/{sts_name}");
        assert_eq!(sts["spec"]["podManagementPolicy"], "Parallel");
        assert_eq!(spec["terminationGracePeriodSeconds"], 30);
        let valkey = container(&sts, "valkey");
        assert_eq!(valkey["startupProbe"]["httpGet"], http_get("/startupz"));
        assert_eq!(valkey["livenessProbe"]["httpGet"], http_get("/livez"));
        assert_eq!(valkey["readinessProbe"]["httpGet"], http_get("/readyz"));
        let prestop = json!({ "httpGet": http_get("/prestop?timeout=20s") });
        assert_eq!(valkey["lifecycle"]["preStop"], prestop, "{name}/{sts_name}");
        let agent = container(&sts, "valkey-sidecar");
        let native = spec["initContainers"]
            .as_array()
            .is_some_and(|i| i.contains(agent));
        if native {
            assert_eq!(agent["restartPolicy"], "Always");
            // The native sidecar must be started before Valkey is: never a probe that needs it.
            assert_eq!(agent["startupProbe"]["tcpSocket"]["port"], 9736, "{name}");
            assert!(agent["lifecycle"].is_null());
        } else {
            assert_eq!(agent["lifecycle"]["preStop"], prestop, "{name}");
        }
        for c in [valkey, agent] {
            let sc = &c["securityContext"];
            assert_eq!(sc["runAsNonRoot"], true, "{name}/{}", c["name"]);
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{name}/{}", c["name"]);
            assert_eq!(
                sc["allowPrivilegeEscalation"], false,
                "{name}/{}",
                c["name"]
            );
            assert_eq!(
                sc["capabilities"]["drop"],
                json!(["ALL"]),
                "{name}/{}",
                c["name"]
            );
            assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault");
        }
        let args = valkey["args"].as_array().unwrap();
        assert!(
            args[0].as_str().unwrap().starts_with("--"),
            "{name}: {args:?}"
        );
        // Settings as arguments (the harness's kubelet reads them); in cluster mode `await` in
        // front of valkey-server, its binary copied in by the first init container.
        let command = valkey["command"].as_array().unwrap();
        assert_eq!(command.last().unwrap(), "valkey-server", "{name}");
        let wrapped = command.len() > 1;
        if wrapped {
            let tool = "/opt/valkey-sidecar/valkey-sidecar";
            assert_eq!(command[..2], [json!(tool), json!("await")], "{name}");
            assert_eq!(command[command.len() - 2], "--", "{name}");
            let install = &spec["initContainers"][0];
            assert_eq!(install["name"], "install-await", "{name}");
            assert_eq!(install["args"], json!(["install", tool]), "{name}");
            assert_eq!(
                install["securityContext"], agent["securityContext"],
                "{name}"
            );
        }
        let cluster = args.iter().any(|a| a == "--cluster-enabled");
        assert_eq!(wrapped, cluster, "{name}: await in cluster mode only");

        let env: BTreeMap<&str, &Value> = agent["env"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap(), e))
            .collect();
        assert_eq!(env["SIDECAR_CLUSTER_NAME"]["value"], "valkey");
        let auth = valkey["env"]
            .as_array()
            .is_some_and(|e| e.iter().any(|v| v["name"] == "VALKEY_PASSWORD"));
        if auth {
            // Auth: the agent's password from a file only it mounts; Valkey gets its hash, and
            // its own password from the Secret via $(VAR).
            assert_eq!(
                env["VALKEY_PASSWORD_FILE"]["value"],
                "/etc/valkey-sidecar/auth/password"
            );
            assert!(
                args.iter().any(|a| a == "#$(VALKEY_AGENT_PASSWORD_SHA256)"),
                "{name}"
            );
            let keys: Vec<&Value> = valkey["env"]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| &e["valueFrom"]["secretKeyRef"]["key"])
                .collect();
            assert!(
                !keys.contains(&&json!("agent-password")),
                "{name}: {keys:?}"
            );
        }
        check_credentials(name, spec, valkey, agent);
    }
}

/// The API token reaches the agent only: no automount, a projected token mounted into the agent
/// alone; the agent's password file likewise.
fn check_credentials(name: &str, spec: &Value, valkey: &Value, agent: &Value) {
    assert_eq!(spec["automountServiceAccountToken"], false, "{name}");
    let mounts = |c: &Value| -> Vec<(String, String)> {
        let all = c["volumeMounts"].as_array().cloned().unwrap_or_default();
        all.iter()
            .map(|m| {
                (
                    m["name"].as_str().unwrap().to_owned(),
                    m["mountPath"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let sa = "/var/run/secrets/kubernetes.io/serviceaccount";
    let token = ("kube-api-access".to_owned(), sa.to_owned());
    assert!(
        mounts(agent).contains(&token),
        "{name}: {:?}",
        mounts(agent)
    );
    for (volume, path) in mounts(valkey) {
        assert!(
            !["kube-api-access", "agent-auth"].contains(&volume.as_str()) && path != sa,
            "{name}: Valkey mounts {volume} at {path}"
        );
    }
    let volumes = spec["volumes"].as_array().unwrap();
    // TLS: of Valkey's Secret the agent mounts only the CA (its certificate is its own).
    let server_tls = volumes.iter().find(|v| v["name"] == "tls");
    let server_secret = server_tls.map(|v| &v["secret"]["secretName"]);
    for (volume, _) in mounts(agent) {
        let v = volumes
            .iter()
            .find(|v| v["name"] == volume.as_str())
            .unwrap();
        assert!(
            Some(&v["secret"]["secretName"]) != server_secret,
            "{name}: {v}"
        );
        for source in v["projected"]["sources"].as_array().into_iter().flatten() {
            let keys = source["secret"]["items"].as_array().into_iter().flatten();
            let keys: Vec<&str> = keys.map(|i| i["key"].as_str().unwrap()).collect();
            let of_valkey = Some(&source["secret"]["name"]) == server_secret;
            assert!(
                !of_valkey || keys == ["ca.crt"],
                "{name}: the agent mounts {keys:?}"
            );
        }
    }
    let api = volumes
        .iter()
        .find(|v| v["name"] == "kube-api-access")
        .unwrap();
    let sources = api["projected"]["sources"].as_array().unwrap();
    assert_eq!(sources[0]["serviceAccountToken"]["path"], "token", "{name}");
}

/// The NetworkPolicy against every port the chart's pods use (no plugin here enforces it, so the
/// rules are read as a plugin would): Valkey's port from the cluster's pods and from clients, the
/// bus from the cluster's pods only, the probe port from no other pod (the node is always
/// allowed), and egress to the cluster's pods, DNS and the apiserver's usual ports.
fn check_network_policy(name: &str, objects: &[Value]) {
    let policies = of_kind(objects, "NetworkPolicy");
    let client = BTreeMap::from([("app".to_owned(), "some-client".to_owned())]);
    for sts in of_kind(objects, "StatefulSet") {
        let labels: BTreeMap<String, String> =
            serde_json::from_value(sts["spec"]["template"]["metadata"]["labels"].clone()).unwrap();
        let mine: Vec<&Value> = policies
            .iter()
            .filter(|p| selects(&p["spec"]["podSelector"], &labels))
            .collect();
        assert_eq!(mine.len(), 1, "{name}: NetworkPolicies selecting the pods");
        let np = mine[0];
        for (port_name, port) in container_ports(&sts) {
            let from_members = allows(np, "ingress", port, Some(&labels));
            let from_client = allows(np, "ingress", port, Some(&client));
            let what = format!("{name}: port {port_name} ({port})");
            match port_name.as_str() {
                "valkey" => assert!(from_members && from_client, "{what}"),
                "bus" => assert!(from_members && !from_client, "{what}"),
                "probe" => assert!(!from_client && !from_members, "{what}"),
                other => panic!("{what}: the test knows no rule for port {other}"),
            }
            if port_name != "probe" {
                assert!(allows(np, "egress", port, Some(&labels)), "{what}: egress");
            }
        }
        for port in [53, 443, 6443] {
            assert!(
                allows(np, "egress", port, None),
                "{name}: egress to port {port}"
            );
        }
    }
    // The one-shot pods (credentials Job, `helm test`): one policy, out to DNS and the apiserver
    // only, nothing in.
    let jobs = of_kind(objects, "Job")
        .into_iter()
        .map(|j| j["spec"]["template"].clone());
    let tests = of_kind(objects, "Pod").into_iter();
    for pod in jobs.chain(tests) {
        let labels: BTreeMap<String, String> =
            serde_json::from_value(pod["metadata"]["labels"].clone()).unwrap();
        let mine: Vec<&Value> = policies
            .iter()
            .filter(|p| selects(&p["spec"]["podSelector"], &labels))
            .collect();
        assert_eq!(
            mine.len(),
            1,
            "{name}: NetworkPolicies selecting {labels:?}"
        );
        assert!(allows(mine[0], "egress", 443, None) && allows(mine[0], "egress", 53, None));
        assert!(
            !allows(mine[0], "egress", 6379, None),
            "{name}: tools reach Valkey"
        );
        assert!(
            !allows(mine[0], "ingress", 9736, None),
            "{name}: tools take connections"
        );
    }
}

/// Every named container port of the pod template (Valkey's and the agent's).
fn container_ports(sts: &Value) -> Vec<(String, u64)> {
    let spec = pod_spec(sts);
    ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec[k].as_array())
        .flatten()
        .filter_map(|c| c["ports"].as_array())
        .flatten()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_owned(),
                p["containerPort"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Whether a policy's `ingress` (peers in `from`) or `egress` (peers in `to`) rules let `port`
/// through for a pod of this namespace with `labels`, or for an outside address (`None`).
fn allows(
    policy: &Value,
    direction: &str,
    port: u64,
    peer: Option<&BTreeMap<String, String>>,
) -> bool {
    let peers_key = if direction == "ingress" { "from" } else { "to" };
    policy["spec"][direction]
        .as_array()
        .into_iter()
        .flatten()
        .any(|rule| {
            let port_ok = rule["ports"]
                .as_array()
                .is_none_or(|ps| ps.iter().any(|p| p["port"].as_u64() == Some(port)));
            let peer_ok = rule[peers_key]
                .as_array()
                .is_none_or(|ps| ps.iter().any(|p| peer_matches(p, peer)));
            port_ok && peer_ok
        })
}

fn peer_matches(p: &Value, peer: Option<&BTreeMap<String, String>>) -> bool {
    match peer {
        Some(labels) => {
            p["namespaceSelector"].is_null()
                && !p["podSelector"].is_null()
                && selects(&p["podSelector"], labels)
        }
        None => p["ipBlock"]["cidr"].is_string(),
    }
}

/// A label selector's verdict on `labels` (matchLabels and matchExpressions).
fn selects(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let by_expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            let value = labels.get(e["key"].as_str().unwrap());
            let values: Vec<&str> = e["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            match e["operator"].as_str().unwrap() {
                "In" => value.is_some_and(|v| values.contains(&v.as_str())),
                "NotIn" => value.is_none_or(|v| !values.contains(&v.as_str())),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                other => panic!("operator {other}"),
            }
        });
    by_labels && by_expressions
}

/// Every pod of a shard with replicas is covered by exactly one budget, whatever its live role
/// (the Eviction API refuses a pod two budgets select); a one-pod shard by none. A budget over the
/// live role label counts its pods (integer minAvailable), never the StatefulSets' sizes.
fn check_budgets(name: &str, objects: &[Value]) {
    let budgets = of_kind(objects, "PodDisruptionBudget");
    for b in &budgets {
        let over_role = b["spec"]["selector"].to_string().contains(ROLE);
        if over_role {
            assert!(b["spec"]["maxUnavailable"].is_null(), "{name}: {b}");
            assert!(b["spec"]["minAvailable"].is_i64(), "{name}: {b}");
        }
        assert_eq!(b["spec"]["unhealthyPodEvictionPolicy"], "IfHealthyBudget");
    }
    for sts in of_kind(objects, "StatefulSet") {
        let base: BTreeMap<String, String> =
            serde_json::from_value(sts["spec"]["template"]["metadata"]["labels"].clone()).unwrap();
        let pods = sts["spec"]["replicas"].as_i64().unwrap();
        for role in [None, Some("primary"), Some("replica")] {
            let mut labels = base.clone();
            if let Some(r) = role {
                labels.insert(ROLE.into(), r.into());
            }
            let covering: Vec<&Value> = budgets
                .iter()
                .filter(|b| selects(&b["spec"]["selector"], &labels))
                .map(|b| &b["metadata"]["name"])
                .collect();
            let want = usize::from(pods > 1);
            assert_eq!(
                covering.len(),
                want,
                "{name}: a {role:?} pod of {}: {covering:?}",
                sts["metadata"]["name"]
            );
        }
    }
}

/// The client Services select the live primary label, the read Services the replica label, the
/// headless one every pod (Ready or not).
fn check_services(name: &str, objects: &[Value]) {
    for svc in of_kind(objects, "Service") {
        let svc_name = svc["metadata"]["name"].as_str().unwrap();
        let selector = &svc["spec"]["selector"];
        if svc_name.ends_with("-headless") {
            assert_eq!(svc["spec"]["clusterIP"], "None");
            assert_eq!(svc["spec"]["publishNotReadyAddresses"], true);
            assert!(selector[ROLE].is_null());
        } else if svc_name.ends_with("-read") {
            assert_eq!(selector[ROLE], "replica", "{name}/{svc_name}");
        } else {
            assert_eq!(selector[ROLE], "primary", "{name}/{svc_name}");
        }
        assert_eq!(selector["valkey.io/cluster"], "valkey");
    }
}

/// The chart's pod template carries what `valkey-sidecar inject` would add to its Valkey: the same
/// probes and preStop wait on Valkey, and an agent with (at least) the same environment, ports,
/// requests and security context.
async fn matches_inject(plane: &ControlPlane, dir: &Path, sts: &Value) {
    let agent = container(sts, "valkey-sidecar").clone();
    let native = agent["restartPolicy"] == "Always";
    let mut bare = sts.clone();
    let spec = &mut bare["spec"]["template"]["spec"];
    spec.as_object_mut().unwrap().remove("initContainers");
    let containers = spec["containers"].as_array_mut().unwrap();
    containers.retain(|c| c["name"] != "valkey-sidecar");
    for key in [
        "startupProbe",
        "livenessProbe",
        "readinessProbe",
        "lifecycle",
    ] {
        containers[0].as_object_mut().unwrap().remove(key);
    }
    let image = agent["image"].as_str().unwrap();
    let mut args = vec!["inject", "--image", image];
    if !native {
        args.push("--classic");
    }
    let mut child = Command::new(env!("CARGO_BIN_EXE_valkey-sidecar"))
        .env_clear()
        .args(&args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(bare.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let injected = dry_run(plane, dir, "injected", &text).await.remove(0);

    let theirs = container(&injected, "valkey");
    let ours = container(sts, "valkey");
    for key in [
        "startupProbe",
        "livenessProbe",
        "readinessProbe",
        "lifecycle",
    ] {
        assert_eq!(ours[key], theirs[key], "Valkey's {key}");
    }
    let their_agent = container(&injected, "valkey-sidecar");
    for key in [
        "ports",
        "securityContext",
        "resources",
        "restartPolicy",
        "lifecycle",
    ] {
        assert_eq!(agent[key], their_agent[key], "the agent's {key}");
    }
    let our_env = agent["env"].as_array().unwrap();
    for var in their_agent["env"].as_array().unwrap() {
        assert!(our_env.contains(var), "the chart's agent lacks {var}");
    }
}

const VALUES_BEGIN: &str = "<!-- values:begin -->";
const VALUES_END: &str = "<!-- values:end -->";

/// The chart manual's values table is `values.yaml`'s own `# --` comments, one row per documented
/// key (regenerate with `UPDATE_RENDERED=1 cargo test --test chart`).
#[test]
fn the_values_table_is_values_yaml() {
    let values = std::fs::read_to_string(chart_dir().join("values.yaml")).unwrap();
    let table = values_table(&values);
    assert!(
        table.lines().count() > 60,
        "values.yaml was not read: {table}"
    );
    let manual_path = chart_dir().join("README.md");
    let manual = std::fs::read_to_string(&manual_path).unwrap();
    let (before, rest) = manual
        .split_once(VALUES_BEGIN)
        .expect("a values:begin marker");
    let (_, after) = rest.split_once(VALUES_END).expect("a values:end marker");
    let regenerated = format!("{before}{VALUES_BEGIN}\n{table}{VALUES_END}{after}");
    if std::env::var_os("UPDATE_RENDERED").is_some() {
        std::fs::write(&manual_path, regenerated).unwrap();
        return;
    }
    assert!(
        manual == regenerated,
        "the values table in {} is stale: regenerate with UPDATE_RENDERED=1 cargo test --test chart",
        manual_path.display()
    );
}

/// `| key | default | description |` for every key a `# --` comment describes; a key whose value
/// is a block (a map or list on the following lines) shows `…` as its default.
fn values_table(yaml: &str) -> String {
    let mut out = String::from("| Value | Default | Description |\n|---|---|---|\n");
    let mut path: Vec<(usize, String)> = Vec::new();
    let mut doc: Option<String> = None;
    for line in yaml.lines() {
        let indent = line.len() - line.trim_start().len();
        let text = line.trim();
        if let Some(start) = text.strip_prefix("# --") {
            doc = Some(start.trim().to_owned());
        } else if let Some(more) = text.strip_prefix('#') {
            if let Some(d) = doc.as_mut() {
                d.push(' ');
                d.push_str(more.trim());
            }
        } else if text.is_empty() || text.starts_with('-') {
            doc = None;
        } else if let Some((key, value)) = text.split_once(':') {
            path.retain(|(i, _)| *i < indent);
            path.push((indent, key.to_owned()));
            if let Some(d) = doc.take() {
                let full: Vec<&str> = path.iter().map(|(_, k)| k.as_str()).collect();
                let value = match value.trim() {
                    "" => "…".to_owned(),
                    v => format!("`{}`", v.replace('|', "\\|")),
                };
                out.push_str(&format!(
                    "| `{}` | {value} | {} |\n",
                    full.join("."),
                    d.replace('|', "\\|")
                ));
            }
        }
    }
    out
}
