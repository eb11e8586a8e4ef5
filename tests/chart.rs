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
    valkey_sidecar_testkit::repo_root().join("examples")
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
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
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
    render_release(RELEASE, NS, apis, sets)
}

/// [`render_for`] as release `release` in namespace `ns`.
fn render_release(release: &str, ns: &str, apis: &[&str], sets: &[&str]) -> String {
    let mut args: Vec<String> = ["template", release, chart_dir().to_str().unwrap(), "-n", ns]
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

/// `tls.certManager`: a Certificate for Valkey with every name a client or the agent verifies
/// (the client Services, each pod under the headless Service, localhost), both usages (Valkey is
/// also a TLS client of its primary and bus peers), and one for the agent's client certificate
/// (client auth only) unless Valkey asks none; the pods mount the Secrets they write.
#[test]
fn cert_manager_makes_the_secrets_the_pods_mount() {
    let issuer = "tls.certManager.issuerRef.name=valkey-ca";
    let on = [
        "tls.enabled=true",
        "tls.certManager.enabled=true",
        issuer,
        "tls.authClients=yes",
    ];
    let objects = rendered_objects(&render_sets(&on).unwrap());
    let certs = of_kind(&objects, "Certificate");
    let names: Vec<&str> = certs
        .iter()
        .map(|c| c["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["valkey-tls", "valkey-agent-tls"]);
    let (server, agent) = (&certs[0]["spec"], &certs[1]["spec"]);
    let dns: Vec<&str> = server["dnsNames"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    for name in [
        "valkey.valkey.svc",
        "valkey-read.valkey.svc",
        "*.valkey-headless.valkey.svc",
        "localhost",
    ] {
        assert!(dns.contains(&name), "{name} missing from {dns:?}");
    }
    assert_eq!(server["usages"], json!(["server auth", "client auth"]));
    assert_eq!(agent["usages"], json!(["client auth"]));
    assert_eq!(agent["commonName"], "valkey-sidecar");
    for c in [server, agent] {
        assert_eq!(c["issuerRef"]["name"], "valkey-ca");
        assert_eq!(c["privateKey"]["rotationPolicy"], "Always");
    }
    // The agent verifies Valkey by the client Service's name, which the certificate carries.
    let sts = &of_kind(&objects, "StatefulSet")[0];
    let verified = env_of(container(sts, "valkey-sidecar"), "VALKEY_TLS_SERVER_NAME");
    assert!(
        dns.contains(&verified["value"].as_str().unwrap()),
        "{verified}"
    );
    let volumes = pod_spec(sts)["volumes"].to_string();
    for secret in [
        server["secretName"].as_str().unwrap(),
        agent["secretName"].as_str().unwrap(),
    ] {
        assert!(
            volumes.contains(&format!("\"{secret}\"")),
            "{secret} not mounted: {volumes}"
        );
    }
    // Valkey asking no client certificate: no agent certificate.
    let no_clients = ["tls.enabled=true", "tls.certManager.enabled=true", issuer];
    let objects = rendered_objects(&render_sets(&no_clients).unwrap());
    assert_eq!(of_kind(&objects, "Certificate").len(), 1);
    // Existing Secrets keep their names; an issuer is required.
    let named = [
        "tls.enabled=true",
        "tls.certManager.enabled=true",
        issuer,
        "tls.existingSecret=mine",
    ];
    let objects = rendered_objects(&render_sets(&named).unwrap());
    assert_eq!(
        of_kind(&objects, "Certificate")[0]["spec"]["secretName"],
        "mine"
    );
    let refused = render_sets(&["tls.enabled=true", "tls.certManager.enabled=true"]).unwrap_err();
    assert!(refused.contains("issuerRef.name is required"), "{refused}");
    // Off by default: no Certificate, and a Secret is still required with TLS.
    assert!(of_kind(&rendered_objects(&render_sets(&[]).unwrap()), "Certificate").is_empty());
    let refused = render_sets(&["tls.enabled=true"]).unwrap_err();
    assert!(
        refused.contains("tls.existingSecret is required"),
        "{refused}"
    );
}

/// With TLS in cluster mode, Valkey announces each node by the hostname its certificate names,
/// so a cluster client that follows a redirect can verify whom it reaches; without TLS, or in
/// replication mode (no redirects), the addresses stay as they were.
#[test]
fn a_tls_cluster_announces_hostnames_its_certificate_names() {
    let args = |sets: &[&str]| {
        let objects = rendered_objects(&render_sets(sets).unwrap());
        let sts = of_kind(&objects, "StatefulSet")[0].clone();
        let valkey = container(&sts, "valkey").clone();
        (valkey["args"].to_string(), env_of(&valkey, "POD_NAME"))
    };
    let tls = ["tls.enabled=true", "tls.existingSecret=t"];
    let (on, pod_name) = args(&tls);
    assert!(
        on.contains(r#""--cluster-announce-hostname","$(POD_NAME).valkey-headless.valkey.svc""#),
        "{on}"
    );
    assert!(
        on.contains(r#""--cluster-preferred-endpoint-type","hostname""#),
        "{on}"
    );
    assert_eq!(
        pod_name["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    let (plain, _) = args(&[]);
    assert!(!plain.contains("announce-hostname"), "{plain}");
    let (replication, _) = args(&[tls[0], tls[1], "mode=replication"]);
    assert!(!replication.contains("announce-hostname"), "{replication}");
}

/// Many deployments side by side: two releases in one namespace and one in another, each at the
/// longest name the chart takes (40 characters, differing only in the last), with every optional
/// object on. No two objects share a name (cluster-scoped ones across namespaces too); every name
/// and label value fits Kubernetes' limits — a Service's and a pod's name 63 characters (a pod's is
/// its hostname), a StatefulSet's 52 (its pods carry `controller-revision-hash: <name>-<10>`); and
/// each release's agents coordinate on their own Lease.
#[test]
fn the_longest_names_fit_and_releases_side_by_side_never_collide() {
    let long = |last: char| {
        format!(
            "{}{last}",
            "a-long-deployment-name-".repeat(2)[..39].to_owned()
        )
    };
    let (a, b) = (long('1'), long('2'));
    assert_eq!(a.len(), 40);
    let sets = [
        "shards=12",
        "metrics.podMonitor.enabled=true",
        "metrics.prometheusRule.enabled=true",
        "replicas=2",
        "placement.zones={zone-a,zone-b}",
        "pdb.primaries=true",
    ];
    let apis = [MAP, "monitoring.coreos.com/v1"];
    let mut seen: BTreeMap<(String, String, String), String> = BTreeMap::new();
    let mut leases = Vec::new();
    for (release, ns) in [(&a, "team-1"), (&b, "team-1"), (&a, "team-2")] {
        let out = render_release(release, ns, &apis, &sets);
        let objects = rendered_objects(&out);
        assert!(
            objects.len() > 20,
            "{release} in {ns}: {} objects",
            objects.len()
        );
        for o in &objects {
            let kind = o["kind"].as_str().unwrap().to_owned();
            let name = o["metadata"]["name"].as_str().unwrap().to_owned();
            let scope = if CLUSTER_SCOPED_KINDS.contains(&kind.as_str()) {
                ""
            } else {
                ns
            };
            let key = (kind.clone(), scope.to_owned(), name.clone());
            let by = format!("{release} in {ns}");
            if let Some(other) = seen.insert(key, by.clone()) {
                panic!("{kind} {name}: rendered by {other} and by {by}");
            }
            check_name_limits(&kind, &name, o);
        }
        let sts = of_kind(&objects, "StatefulSet");
        assert_eq!(sts.len(), 12, "{release} in {ns}");
        // The agents' Lease is `<valkey.io/cluster>-coordinator` in their namespace (the label
        // reaches them through the downward API).
        let cluster = &sts[0]["spec"]["template"]["metadata"]["labels"]["valkey.io/cluster"];
        leases.push((ns, format!("{}-coordinator", cluster.as_str().unwrap())));
    }
    let cluster_wide = seen.keys().filter(|(_, scope, _)| scope.is_empty()).count();
    assert!(
        cluster_wide >= 3 * 8,
        "{cluster_wide} cluster-scoped objects"
    );
    leases.sort();
    leases.dedup();
    assert_eq!(leases.len(), 3, "each release its own Lease: {leases:?}");
    // One character more is refused, naming the value to set.
    let long_release = format!("{a}x");
    let refused = render(&long_release, "team-1", &[], &[]).unwrap_err();
    assert!(
        format!("{refused:#}").contains("clusterName"),
        "{refused:#}"
    );
}

/// Kubernetes' limits on `o`'s name and its labels (the pod template's too).
fn check_name_limits(kind: &str, name: &str, o: &Value) {
    let limit = match kind {
        // `<name>-<ordinal>` pods and `controller-revision-hash: <name>-<10 characters>`.
        "StatefulSet" => 52,
        "Service" | "ServiceAccount" | "NetworkPolicy" => 63,
        _ => 253,
    };
    assert!(
        name.len() <= limit,
        "{kind} {name}: {} characters",
        name.len()
    );
    if kind == "StatefulSet" {
        let replicas = &o["spec"]["replicas"];
        let replicas = replicas
            .as_u64()
            .or_else(|| replicas.as_str()?.parse().ok());
        let replicas = replicas.unwrap_or_else(|| panic!("{name}: {:?}", o["spec"]["replicas"]));
        let pod = format!("{name}-{}", replicas - 1);
        assert!(pod.len() <= 63, "pod {pod}: {} characters", pod.len());
    }
    let label_sets = [
        &o["metadata"]["labels"],
        &o["spec"]["template"]["metadata"]["labels"],
    ];
    for labels in label_sets.into_iter().filter_map(Value::as_object) {
        for (key, value) in labels {
            let v = value.as_str().unwrap_or_default();
            assert!(
                v.len() <= 63,
                "{kind} {name}: label {key}={v} ({} characters)",
                v.len()
            );
        }
    }
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
    assert_eq!(cluster_scoped(&render_for(&[MAP], &[])).len(), 10);
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
            "sidecar.acknowledgeNoAdmissionPolicy=true",
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

/// An apiserver with the namespace and the agents' ServiceAccount, which `helm test`'s pod names
/// and pod admission wants to exist even in a dry run (in a real `helm test` the release made it).
async fn dry_run_plane() -> ControlPlane {
    let plane = ControlPlane::start(ControlPlaneOptions::apiserver_only())
        .await
        .unwrap();
    kubectl(&plane, &["create", "namespace", NS]).await;
    kubectl(
        &plane,
        &["create", "serviceaccount", "valkey-sidecar", "-n", NS],
    )
    .await;
    plane
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_objects_pass_a_server_side_dry_run() {
    let plane = dry_run_plane().await;
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
    // Classic mode: the agent is a regular container; the init containers write the file Valkey
    // includes and install `await`, and finish; the settings container is a native sidecar.
    let inits = classic["initContainers"].as_array().unwrap();
    let names: Vec<&Value> = inits.iter().map(|c| &c["name"]).collect();
    let settings = &json!("valkey-settings");
    assert_eq!(
        names,
        [&json!("valkey-config"), settings, &json!("install-await")]
    );
    assert_eq!(inits[1]["restartPolicy"], "Always");
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
        // The Valkey container holds no password that can form a cluster: the user brings it.
        "pw=$(kubectl get secret -n valkey valkey-auth",
        "-c valkey -- env VALKEYCLI_AUTH=\"$pw\" valkey-cli",
        // A render cannot know the apiserver: the notes say how to narrow the agents' egress.
        "kubectl get endpointslice -n default kubernetes",
    ] {
        assert!(manual.contains(want), "NOTES lack {want:?}:\n{manual}");
    }
    assert!(!manual.contains("$VALKEY_PASSWORD"), "{manual}");
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
        // A late answer from the agent's cache is a starved node, not a dead Valkey.
        assert_eq!(valkey["livenessProbe"]["timeoutSeconds"], 5);
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
            let inits = spec["initContainers"].as_array().unwrap();
            let install = inits.iter().find(|c| c["name"] == "install-await");
            let install = install.unwrap_or_else(|| panic!("{name}: no install-await"));
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
        // `--include` alone is not auth: without it the file still carries maxmemory.
        let auth = args.iter().any(|a| a == "#$(VALKEY_AGENT_PASSWORD_SHA256)");
        if auth {
            // Auth: the agent's password from a file only it mounts; Valkey gets its hash, and
            // the default password's hash and the replication login from the file the
            // valkey-config init container writes (only it mounts the default password).
            check_valkey_config(name, spec, valkey);
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
            for secret in [
                "agent-password",
                "default-password",
                "next-default-password",
            ] {
                assert!(!keys.contains(&&json!(secret)), "{name}: {keys:?}");
            }
        }
        check_credentials(name, spec, valkey, agent);
    }
}

/// The default password is mounted by the valkey-config init container only; Valkey includes the
/// file it writes, from a memory volume.
fn check_valkey_config(name: &str, spec: &Value, valkey: &Value) {
    let mounts = |c: &Value| -> Vec<String> {
        let list = c["volumeMounts"].as_array().cloned().unwrap_or_default();
        list.iter()
            .map(|m| m["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let inits = spec["initContainers"].as_array().unwrap();
    let writer = inits.iter().find(|c| c["name"] == "valkey-config").unwrap();
    assert_eq!(writer["args"][0], "valkey-config", "{name}");
    assert!(
        mounts(writer).contains(&"valkey-passwords".to_owned()),
        "{name}"
    );
    let containers = spec["containers"].as_array().unwrap().iter();
    for c in containers.chain(inits.iter().filter(|c| c["name"] != "valkey-config")) {
        assert!(
            !mounts(c).contains(&"valkey-passwords".to_owned()),
            "{name}: {c}"
        );
    }
    assert!(
        mounts(valkey).contains(&"valkey-config".to_owned()),
        "{name}"
    );
    let volumes = spec["volumes"].as_array().unwrap();
    let conf = volumes
        .iter()
        .find(|v| v["name"] == "valkey-config")
        .unwrap();
    assert_eq!(conf["emptyDir"]["medium"], "Memory", "{name}");
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
            let what = format!("{name}: port {port_name} ({port:?})");
            match port_name.as_str() {
                "valkey" => assert!(from_members && from_client, "{what}"),
                "bus" | "heartbeat" => assert!(from_members && !from_client, "{what}"),
                "probe" => assert!(!from_client && !from_members, "{what}"),
                other => panic!("{what}: the test knows no rule for port {other}"),
            }
            if port_name != "probe" {
                assert!(allows(np, "egress", port, Some(&labels)), "{what}: egress");
            }
        }
        for port in [(53, "UDP"), (53, "TCP"), (443, "TCP"), (6443, "TCP")] {
            assert!(
                allows(np, "egress", port, None),
                "{name}: egress to port {port:?}"
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
        assert!(
            allows(mine[0], "egress", (443, "TCP"), None)
                && allows(mine[0], "egress", (53, "UDP"), None)
        );
        assert!(
            !allows(mine[0], "egress", (6379, "TCP"), None),
            "{name}: tools reach Valkey"
        );
        assert!(
            !allows(mine[0], "ingress", (9736, "TCP"), None),
            "{name}: tools take connections"
        );
    }
}

/// Every named container port of the pod template (Valkey's and the agent's).
/// Each container port: name, (number, protocol).
fn container_ports(sts: &Value) -> Vec<(String, (u64, &str))> {
    let spec = pod_spec(sts);
    ["containers", "initContainers"]
        .iter()
        .filter_map(|k| spec[k].as_array())
        .flatten()
        .filter_map(|c| c["ports"].as_array())
        .flatten()
        .map(|p| {
            let protocol = p["protocol"].as_str().unwrap_or("TCP");
            let port = (p["containerPort"].as_u64().unwrap(), protocol);
            (p["name"].as_str().unwrap().to_owned(), port)
        })
        .collect()
}

/// Whether a policy's `ingress` (peers in `from`) or `egress` (peers in `to`) rules let `port`
/// through for a pod of this namespace with `labels`, or for an outside address (`None`).
fn allows(
    policy: &Value,
    direction: &str,
    (port, protocol): (u64, &str),
    peer: Option<&BTreeMap<String, String>>,
) -> bool {
    let peers_key = if direction == "ingress" { "from" } else { "to" };
    policy["spec"][direction]
        .as_array()
        .into_iter()
        .flatten()
        .any(|rule| {
            let port_ok = rule["ports"].as_array().is_none_or(|ps| {
                ps.iter().any(|p| {
                    let proto = p["protocol"].as_str().unwrap_or("TCP");
                    p["port"].as_u64() == Some(port) && proto == protocol
                })
            });
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
    // The chart's own containers beside Valkey (inject adds only the agent).
    containers.retain(|c| c["name"] != "valkey-sidecar" && c["name"] != "valkey-settings");
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
    for key in ["ports", "resources", "restartPolicy", "lifecycle"] {
        assert_eq!(agent[key], their_agent[key], "the agent's {key}");
    }
    // The same lock-down; only the chart fixes the image's user id (outside its restricted
    // profile), which a platform assigning ids would refuse from `inject`.
    let mut ours = agent["securityContext"].clone();
    let fixed = ours.as_object_mut().unwrap();
    assert_eq!(fixed.remove("runAsUser"), Some(json!(65532)));
    assert_eq!(fixed.remove("runAsGroup"), Some(json!(65532)));
    assert_eq!(
        ours, their_agent["securityContext"],
        "the agent's securityContext"
    );
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

/// The rendered objects as JSON, read by the crate's own YAML reader (every scalar a string): for
/// checks that need no apiserver.
fn rendered_objects(rendered: &str) -> Vec<Value> {
    monitoring::yaml_documents(rendered)
        .into_iter()
        .filter(|o| o.get("kind").is_some())
        .collect()
}

/// Every pod spec of the objects (StatefulSets' and Jobs' templates, Pods), by `<kind>/<name>`.
fn pod_specs(objects: &[Value]) -> Vec<(String, Value)> {
    objects
        .iter()
        .filter_map(|o| {
            let spec = match o["kind"].as_str()? {
                "Pod" => &o["spec"],
                "StatefulSet" | "Job" => &o["spec"]["template"]["spec"],
                _ => return None,
            };
            Some((
                format!("{}/{}", o["kind"], o["metadata"]["name"]),
                spec.clone(),
            ))
        })
        .collect()
}

/// Every `image:` anywhere in `value`, by the kind of the object it is in.
fn images(kind: &str, value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("image", Value::String(image)) => out.push((kind.to_owned(), image.clone())),
                    _ => images(kind, v, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| images(kind, v, out)),
        _ => {}
    }
}

/// `global.imageRegistry` is in front of every image of a full render (the Valkey pods' three
/// containers, the credentials Job, the `helm test` pod), replacing the registry a repository
/// names; nothing changes without it.
#[test]
fn global_image_registry_prefixes_every_image_the_chart_renders() {
    let registry = "mirror.example.com:5000/team";
    for sets in [
        &[][..],
        &[
            "sidecar.mode=classic",
            "mode=replication",
            "auth.rotation=accept",
        ][..],
    ] {
        let mut with: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        with.push(format!("global.imageRegistry={registry}"));
        let with: Vec<&str> = with.iter().map(String::as_str).collect();
        let mut found = Vec::new();
        for o in rendered_objects(&render_sets(&with).unwrap()) {
            images(o["kind"].as_str().unwrap(), &o, &mut found);
        }
        let kinds: std::collections::BTreeSet<&str> =
            found.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            kinds.into_iter().collect::<Vec<_>>(),
            ["Job", "Pod", "StatefulSet"],
            "{found:?}"
        );
        for (kind, image) in &found {
            let path = image
                .strip_prefix(&format!("{registry}/"))
                .unwrap_or_else(|| panic!("{sets:?}: {kind} runs {image}"));
            assert!(
                path.starts_with("valkey/valkey:")
                    || path.starts_with("valkey-sidecar/valkey-sidecar:"),
                "{sets:?}: {kind} runs {image}"
            );
        }
        let mut plain = Vec::new();
        for o in rendered_objects(&render_sets(sets).unwrap()) {
            images("", &o, &mut plain);
        }
        assert_eq!(plain.len(), found.len());
        assert!(plain.iter().all(|(_, i)| !i.contains("mirror.example.com")));
    }
    // A registry host (a dot, a port, `localhost`) is replaced; a digest stays.
    let out = render_sets(&[
        "global.imageRegistry=mirror.example.com/",
        "sidecar.image.repository=localhost:5000/agents/valkey-sidecar",
        "valkey.image.repository=docker.io/library/valkey",
        "valkey.image.digest=sha256:0123456789abcdef0123456789abcdef",
    ])
    .unwrap();
    assert!(
        out.contains("image: mirror.example.com/agents/valkey-sidecar:"),
        "{out}"
    );
    assert!(
        out.contains(
            "image: mirror.example.com/library/valkey@sha256:0123456789abcdef0123456789abcdef"
        ),
        "{out}"
    );
}

/// `imagePullSecrets` (names or `{name}`) after `global.imagePullSecrets`, without repeats, on
/// every pod spec and every ServiceAccount the chart makes; `priorityClassName` on every pod spec;
/// neither by default.
#[test]
fn pull_secrets_and_priority_class_reach_every_pod() {
    let sets = [
        "global.imagePullSecrets[0]=shared",
        "imagePullSecrets[0]=mine",
        "imagePullSecrets[1].name=theirs",
        "imagePullSecrets[2].name=shared",
        "priorityClassName=valkey-critical",
        "sidecar.mode=classic",
    ];
    let objects = rendered_objects(&render_sets(&sets).unwrap());
    let want = json!([{"name": "shared"}, {"name": "mine"}, {"name": "theirs"}]);
    let specs = pod_specs(&objects);
    assert_eq!(specs.len(), 3 + 2, "{specs:?}");
    for (name, spec) in &specs {
        assert_eq!(spec["imagePullSecrets"], want, "{name}");
        assert_eq!(spec["priorityClassName"], "valkey-critical", "{name}");
    }
    let accounts = of_kind(&objects, "ServiceAccount");
    assert_eq!(accounts.len(), 2);
    for sa in &accounts {
        assert_eq!(sa["imagePullSecrets"], want, "{sa}");
    }
    let defaults = rendered_objects(&render_sets(&[]).unwrap());
    for (name, spec) in pod_specs(&defaults) {
        assert!(spec.get("imagePullSecrets").is_none(), "{name}");
        assert!(spec.get("priorityClassName").is_none(), "{name}");
    }
    assert!(
        of_kind(&defaults, "ServiceAccount")
            .iter()
            .all(|sa| sa.get("imagePullSecrets").is_none())
    );
}

/// A values file of every pod extension value: one of each, tpl-rendered where it can be.
const EXTENSIONS: &str = r#"
podAnnotations:
  example.com/backup: "true"
valkey:
  extraEnv:
    - name: MAXMEMORY
      valueFrom:
        resourceFieldRef:
          containerName: valkey
          resource: limits.memory
  extraVolumeMounts:
    - name: backup
      mountPath: /backup
extraVolumes:
  - name: backup
    emptyDir: {}
extraInitContainers:
  - name: restore
    image: example.com/restore:1
    volumeMounts:
      - name: backup
        mountPath: /backup
extraContainers:
  - name: shipper
    image: example.com/shipper:1
    args: ["--secret", '{{ include "valkey-sidecar.authSecret" . }}']
    volumeMounts:
      - name: backup
        mountPath: /backup
"#;

fn render_extensions(dir: &Path, sets: &[&str]) -> String {
    let file = dir.join("extensions.yaml");
    std::fs::write(&file, EXTENSIONS).unwrap();
    let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
    render(RELEASE, NS, &[file], &sets).unwrap_or_else(|e| panic!("{e:#}"))
}

/// The extension values land in every Valkey pod after the chart's own, which stay as they were:
/// the extra container (templated), init container and volume, Valkey's extra env and mount, the
/// pod annotation. The defaults render none of them (the rendered examples above hold that).
#[test]
fn extra_containers_volumes_and_env_join_the_chart_own() {
    let dir = tempfile::tempdir().unwrap();
    for mode in ["native", "classic"] {
        let set = format!("sidecar.mode={mode}");
        let theirs = rendered_objects(&render_extensions(dir.path(), &[set.as_str()]));
        let ours = rendered_objects(&render_sets(&[set.as_str()]).unwrap());
        let (theirs, ours) = (
            of_kind(&theirs, "StatefulSet"),
            of_kind(&ours, "StatefulSet"),
        );
        assert_eq!(theirs.len(), 3);
        for (t, o) in theirs.iter().zip(&ours) {
            let (ts, os) = (pod_spec(t), pod_spec(o));
            let name = t["metadata"]["name"].as_str().unwrap();
            assert_eq!(
                t["spec"]["template"]["metadata"]["annotations"]["example.com/backup"],
                "true"
            );
            // Each list: the chart's own entries unchanged (Valkey's container: below), then
            // the extra one.
            let extended = |key: &str, extra: &str| {
                let (t, o) = (ts[key].as_array().unwrap(), os[key].as_array().unwrap());
                for (t, o) in t.iter().zip(o).filter(|(_, o)| o["name"] != "valkey") {
                    assert_eq!(t, o, "{name}: {key}");
                }
                assert_eq!(
                    t[..o.len()].iter().map(|c| &c["name"]).collect::<Vec<_>>(),
                    o.iter().map(|c| &c["name"]).collect::<Vec<_>>(),
                    "{name}: {key}"
                );
                assert_eq!(t.len(), o.len() + 1, "{name}: {key}");
                assert_eq!(t[o.len()]["name"], extra, "{name}: {key}");
                t[o.len()].clone()
            };
            let shipper = extended("containers", "shipper");
            assert_eq!(
                shipper["args"],
                json!(["--secret", "valkey-auth"]),
                "{name}"
            );
            extended("initContainers", "restore");
            extended("volumes", "backup");
            let valkey = |spec: &Value| -> Value {
                spec["containers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["name"] == "valkey")
                    .unwrap()
                    .clone()
            };
            let (tv, ov) = (valkey(ts), valkey(os));
            for (key, extra) in [("env", "MAXMEMORY"), ("volumeMounts", "backup")] {
                let (t, o) = (tv[key].as_array().unwrap(), ov[key].as_array().unwrap());
                assert_eq!(&t[..o.len()], &o[..], "{name}: valkey's {key}");
                assert_eq!(t[o.len()..].len(), 1, "{name}: valkey's {key}");
                assert_eq!(t[o.len()]["name"], extra, "{name}: valkey's {key}");
            }
            let mut rest = tv.clone();
            let mut rest_ours = ov.clone();
            for key in ["env", "volumeMounts"] {
                rest.as_object_mut().unwrap().remove(key);
                rest_ours.as_object_mut().unwrap().remove(key);
            }
            assert_eq!(rest, rest_ours, "{name}: valkey");
        }
    }
    // Valkey's env alone, without auth or await (the chart sets none then).
    let bare = render_extensions(
        dir.path(),
        &["auth.enabled=false", "valkey.awaitStart=false"],
    );
    let sts = of_kind(&rendered_objects(&bare), "StatefulSet");
    assert_eq!(container(&sts[0], "valkey")["env"][0]["name"], "MAXMEMORY");
}

/// What the apiserver makes of a render with every extension value: accepted (server-side dry
/// run), the extra pieces where the chart put them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_values_pass_a_server_side_dry_run() {
    let plane = dry_run_plane().await;
    // Pod admission wants the priority class to exist.
    kubectl(
        &plane,
        &["create", "priorityclass", "valkey-critical", "--value=1000"],
    )
    .await;
    let dir = tempfile::tempdir().unwrap();
    let rendered = render_extensions(
        dir.path(),
        &[
            "global.imageRegistry=mirror.example.com",
            "imagePullSecrets[0]=pull",
            "priorityClassName=valkey-critical",
        ],
    );
    let objects = dry_run(&plane, dir.path(), "extensions", &rendered).await;
    assert_eq!(objects.len(), documents(&rendered).len());
    let sts = of_kind(&objects, "StatefulSet");
    let spec = pod_spec(&sts[0]);
    assert_eq!(spec["priorityClassName"], "valkey-critical");
    assert_eq!(spec["imagePullSecrets"], json!([{"name": "pull"}]));
    assert_eq!(
        container(&sts[0], "shipper")["image"],
        "example.com/shipper:1"
    );
    assert_eq!(
        container(&sts[0], "restore")["image"],
        "example.com/restore:1"
    );
    let valkey = container(&sts[0], "valkey")["image"].as_str().unwrap();
    assert!(
        valkey.starts_with("mirror.example.com/valkey/valkey:"),
        "{valkey}"
    );
    let pod = &of_kind(&objects, "Pod")[0];
    assert_eq!(pod["spec"]["priorityClassName"], "valkey-critical");
}

/// Wrong shapes of the extension values: the schema refuses them, the template the env names it
/// sets itself.
#[test]
fn extension_values_the_chart_refuses() {
    let cases: &[(&str, &str)] = &[
        ("extraContainers[0].image=x", "missing property 'name'"),
        ("imagePullSecrets[0].nam=x", "/imagePullSecrets/0"),
        (
            "valkey.extraVolumeMounts[0].name=x",
            "missing property 'mountPath'",
        ),
        ("global.imageRegistry=5000", "/global/imageRegistry"),
        (
            "valkey.extraEnv[0].name=VALKEY_AGENT_PASSWORD_SHA256",
            "sets it from its own values",
        ),
    ];
    for (set, why) in cases {
        let err = render_sets(&[set]).expect_err(set);
        assert!(err.contains(why), "{set}: {err}");
    }
}

// Monitoring (values `metrics`): the monitors, the rules, the dashboard and the exporter.

#[path = "support/monitoring.rs"]
mod monitoring;

/// The objects rendered with `sets`, as JSON.
fn monitoring_render(sets: &[&str]) -> Vec<Value> {
    let rendered = render_sets(sets).unwrap_or_else(|e| panic!("{e}"));
    monitoring::yaml_documents(&rendered)
        .into_iter()
        .filter(|o| o.get("kind").is_some())
        .collect()
}

const MONITORING_KINDS: [&str; 3] = ["PodMonitor", "ServiceMonitor", "PrometheusRule"];

fn dashboard_maps(objects: &[Value]) -> Vec<Value> {
    of_kind(objects, "ConfigMap")
        .into_iter()
        .filter(|c| c["data"].get("valkey-sidecar.json").is_some())
        .collect()
}

fn exporters(objects: &[Value]) -> Vec<Value> {
    of_kind(objects, "StatefulSet")
        .iter()
        .flat_map(|s| pod_spec(s)["containers"].as_array().unwrap().clone())
        .filter(|c| c["name"] == "exporter")
        .collect()
}

#[test]
fn monitoring_objects_render_only_when_asked() {
    let off = monitoring_render(&[]);
    for kind in MONITORING_KINDS {
        assert!(of_kind(&off, kind).is_empty(), "{kind} without asking");
    }
    assert!(dashboard_maps(&off).is_empty());
    assert!(exporters(&off).is_empty());
    let policy = &of_kind(&off, "NetworkPolicy")[0];
    assert!(!policy.to_string().contains("monitoring"), "{policy}");
    for (set, kind) in [
        ("metrics.podMonitor.enabled=true", "PodMonitor"),
        ("metrics.serviceMonitor.enabled=true", "ServiceMonitor"),
        ("metrics.prometheusRule.enabled=true", "PrometheusRule"),
    ] {
        let on = monitoring_render(&[set]);
        for k in MONITORING_KINDS {
            let want = usize::from(k == kind);
            assert_eq!(of_kind(&on, k).len(), want, "{set}: {k}");
        }
    }
    let on = monitoring_render(&["metrics.dashboard.enabled=true"]);
    assert_eq!(dashboard_maps(&on).len(), 1);
    let on = monitoring_render(&["metrics.exporter.enabled=true"]);
    assert_eq!(exporters(&on).len(), 3, "one per shard's pods");
}

/// The labels of every Valkey pod template, by StatefulSet.
fn pod_labels(objects: &[Value]) -> Vec<BTreeMap<String, String>> {
    of_kind(objects, "StatefulSet")
        .iter()
        .map(|s| {
            serde_json::from_value(s["spec"]["template"]["metadata"]["labels"].clone()).unwrap()
        })
        .collect()
}

/// The names of the ports of a pod template's containers (the agent's, native or classic, and the
/// exporter's).
fn port_names(sts: &Value) -> std::collections::BTreeSet<String> {
    ["containers", "initContainers"]
        .iter()
        .filter_map(|k| pod_spec(sts)[k].as_array())
        .flatten()
        .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
        .map(|p| p["name"].as_str().unwrap().to_owned())
        .collect()
}

/// The label a monitor's `podTargetLabels` entry becomes on the series (the Prometheus
/// Operator's `sanitizeLabelName`: every character outside `[a-zA-Z0-9_]` becomes `_`).
fn sanitized(label: &str) -> String {
    label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect()
}

#[test]
fn the_monitors_select_the_agents_and_copy_the_labels_the_rules_need() {
    for sidecar in ["classic", "native"] {
        let mode = format!("sidecar.mode={sidecar}");
        let objects = monitoring_render(&[
            "metrics.podMonitor.enabled=true",
            "metrics.serviceMonitor.enabled=true",
            "metrics.exporter.enabled=true",
            &mode,
        ]);
        let statefulsets = of_kind(&objects, "StatefulSet");
        let rules = monitoring::read("prometheus-rules.yaml");
        let dashboard = monitoring::read("dashboard.json");
        // The PodMonitor: every Valkey pod, through ports its containers name.
        let pm = &of_kind(&objects, "PodMonitor")[0];
        for labels in pod_labels(&objects) {
            assert!(selects(&pm["spec"]["selector"], &labels), "{labels:?}");
        }
        assert_eq!(pm["spec"]["namespaceSelector"]["matchNames"], json!([NS]));
        let ports: Vec<&str> = pm["spec"]["podMetricsEndpoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["port"].as_str().unwrap())
            .collect();
        assert_eq!(ports, ["probe", "exporter"]);
        for sts in &statefulsets {
            let names = port_names(sts);
            assert!(
                ports.iter().all(|p| names.contains(*p)),
                "{sidecar}: {names:?}"
            );
        }
        // Both monitors copy the pod labels the rules and the dashboard group by.
        let sm = &of_kind(&objects, "ServiceMonitor")[0];
        for monitor in [pm, sm] {
            let copied: Vec<&str> = monitor["spec"]["podTargetLabels"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| l.as_str().unwrap())
                .collect();
            assert_eq!(copied, ["valkey.io/cluster", "valkey.io/shard-index"]);
            for label in copied {
                let series_label = sanitized(label);
                assert!(
                    rules.contains(&series_label),
                    "the rules use {series_label}"
                );
                for labels in pod_labels(&objects) {
                    assert!(labels.contains_key(label), "pods carry {label}");
                }
            }
        }
        assert!(dashboard.contains("valkey_io_cluster"));
        // The ServiceMonitor: only the headless Service (every pod, Ready or not), whose ports it
        // names.
        let services = of_kind(&objects, "Service");
        let selected: Vec<&Value> = services
            .iter()
            .filter(|s| {
                let labels: BTreeMap<String, String> =
                    serde_json::from_value(s["metadata"]["labels"].clone()).unwrap();
                selects(&sm["spec"]["selector"], &labels)
            })
            .collect();
        assert_eq!(selected.len(), 1, "{selected:?}");
        let headless = selected[0];
        assert_eq!(headless["metadata"]["name"], "valkey-headless");
        assert_eq!(headless["spec"]["publishNotReadyAddresses"], "true");
        let service_ports: std::collections::BTreeSet<&str> = headless["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        for e in sm["spec"]["endpoints"].as_array().unwrap() {
            assert!(service_ports.contains(e["port"].as_str().unwrap()), "{e}");
        }
    }
}

/// Whether an ingress rule lets a peer `peer` accepts reach `port` (the rendered YAML read as is:
/// every scalar a string).
fn ingress_from(policy: &Value, port: u64, peer: impl Fn(&Value) -> bool) -> bool {
    policy["spec"]["ingress"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|rule| {
            let port_ok = rule["ports"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(|p| p["port"] == port.to_string().as_str()));
            let peer_ok = rule["from"]
                .as_array()
                .is_some_and(|ps| ps.iter().any(&peer));
            port_ok && peer_ok
        })
}

/// A pod of the namespace `monitoring` (where the default `metrics.scrapers` are).
fn from_monitoring(policy: &Value, port: u64) -> bool {
    ingress_from(policy, port, |p| {
        p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "monitoring"
    })
}

#[test]
fn the_network_policy_opens_the_metrics_ports_to_the_scrapers_when_a_monitor_is_on() {
    let policy = |sets: &[&str]| of_kind(&monitoring_render(sets), "NetworkPolicy")[0].clone();
    let off = policy(&["metrics.exporter.enabled=true"]);
    assert!(!from_monitoring(&off, 9736) && !from_monitoring(&off, 9121));
    for monitor in ["podMonitor", "serviceMonitor"] {
        let on = format!("metrics.{monitor}.enabled=true");
        let agent_only = policy(&[&on]);
        assert!(from_monitoring(&agent_only, 9736), "{monitor}");
        assert!(
            !from_monitoring(&agent_only, 9121),
            "{monitor}: no exporter"
        );
        let both = policy(&[&on, "metrics.exporter.enabled=true"]);
        assert!(from_monitoring(&both, 9736) && from_monitoring(&both, 9121));
    }
    // Scrapers of your own, e.g. Prometheus' pods in their namespace.
    let own = policy(&[
        "metrics.podMonitor.enabled=true",
        "metrics.scrapers[0].podSelector.matchLabels.app=prometheus",
    ]);
    assert!(!from_monitoring(&own, 9736));
    let prometheus = |p: &Value| p["podSelector"]["matchLabels"]["app"] == "prometheus";
    assert!(ingress_from(&own, 9736, prometheus));
}

#[test]
fn the_prometheus_rule_holds_exactly_the_rule_files_groups() {
    let objects = monitoring_render(&[
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.labels.release=kube-prometheus-stack",
    ]);
    let rule = &of_kind(&objects, "PrometheusRule")[0];
    let file = monitoring::yaml(&monitoring::read("prometheus-rules.yaml"));
    assert_eq!(
        rule["spec"], file,
        "the PrometheusRule's spec is the rule file"
    );
    assert_eq!(
        rule["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    assert_eq!(rule["metadata"]["namespace"], NS);
    // The alerts' own templates reach Prometheus untouched by helm.
    assert!(rule["spec"].to_string().contains("{{ $labels.namespace }}"));
}

#[test]
fn the_dashboard_config_map_holds_the_dashboard_for_grafanas_sidecar() {
    let objects = monitoring_render(&["metrics.dashboard.enabled=true"]);
    let map = &dashboard_maps(&objects)[0];
    assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(map["metadata"]["namespace"], NS);
    let shipped: Value =
        serde_json::from_str(map["data"]["valkey-sidecar.json"].as_str().unwrap()).unwrap();
    assert_eq!(shipped, monitoring::dashboard());
    let elsewhere = monitoring_render(&[
        "metrics.dashboard.enabled=true",
        "metrics.dashboard.namespace=grafana",
        "metrics.dashboard.labels.grafana_dashboard=null",
        "metrics.dashboard.labels.dashboards=valkey",
        "metrics.dashboard.annotations.grafana_folder=Valkey",
    ]);
    let map = &dashboard_maps(&elsewhere)[0];
    assert_eq!(map["metadata"]["namespace"], "grafana");
    assert!(map["metadata"]["labels"].get("grafana_dashboard").is_none());
    assert_eq!(map["metadata"]["labels"]["dashboards"], "valkey");
    assert_eq!(map["metadata"]["annotations"]["grafana_folder"], "Valkey");
}

fn env_of(container: &Value, name: &str) -> Value {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

#[test]
fn the_exporter_logs_in_with_the_auth_secret_and_runs_locked_down() {
    let objects = monitoring_render(&["metrics.exporter.enabled=true"]);
    let exporter = &exporters(&objects)[0];
    assert!(
        exporter["image"]
            .as_str()
            .unwrap()
            .starts_with("oliver006/redis_exporter:v1."),
        "{exporter}"
    );
    assert_eq!(
        env_of(exporter, "REDIS_ADDR")["value"],
        "redis://localhost:6379"
    );
    let password = &env_of(exporter, "REDIS_PASSWORD")["valueFrom"]["secretKeyRef"];
    assert_eq!(password["name"], "valkey-auth");
    assert_eq!(password["key"], "default-password");
    assert_eq!(
        exporter["ports"],
        json!([{"name": "exporter", "containerPort": "9121"}])
    );
    let security = &exporter["securityContext"];
    assert_eq!(security["runAsNonRoot"], "true");
    assert_eq!(security["readOnlyRootFilesystem"], "true");
    assert_eq!(security["allowPrivilegeEscalation"], "false");
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert!(!exporter["resources"]["requests"].is_null());
    // No password without auth; no fixed user in the restricted profile.
    let bare = monitoring_render(&["metrics.exporter.enabled=true", "auth.enabled=false"]);
    assert!(env_of(&exporters(&bare)[0], "REDIS_PASSWORD").is_null());
    let restricted = monitoring_render(&["metrics.exporter.enabled=true", "profile=restricted"]);
    assert!(exporters(&restricted)[0]["securityContext"]["runAsUser"].is_null());
    // TLS: rediss to the pod's loopback, with the agent's client certificate.
    let tls = monitoring_render(&[
        "metrics.exporter.enabled=true",
        "tls.enabled=true",
        "tls.existingSecret=valkey-tls",
        "tls.authClients=yes",
        "tls.agentExistingSecret=valkey-agent-tls",
    ]);
    let exporter = &exporters(&tls)[0];
    assert_eq!(
        env_of(exporter, "REDIS_ADDR")["value"],
        "rediss://localhost:6379"
    );
    assert_eq!(
        env_of(exporter, "REDIS_EXPORTER_TLS_CLIENT_CERT_FILE")["value"],
        "/etc/redis_exporter/tls/tls.crt"
    );
    assert_eq!(exporter["volumeMounts"][0]["name"], "agent-tls");
}

/// The StatefulSets' update strategy, the agent's `SIDECAR_ROLL` and whether the Role grants
/// evictions and StatefulSet reads, for a rendering.
fn rollout_of(sets: &[&str]) -> (Vec<String>, Option<String>, bool, bool) {
    let objects = rendered_objects(&render_sets(sets).unwrap());
    let sets = of_kind(&objects, "StatefulSet");
    let strategy = sets.iter().map(|s| {
        s["spec"]["updateStrategy"]["type"]
            .as_str()
            .unwrap()
            .to_owned()
    });
    let env = container(&sets[0], "valkey-sidecar")["env"]
        .as_array()
        .unwrap()
        .clone();
    let roll = env.iter().find(|e| e["name"] == "SIDECAR_ROLL");
    let roll = roll.map(|e| e["value"].as_str().unwrap().to_owned());
    let role = of_kind(&objects, "Role")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "valkey-sidecar")
        .unwrap();
    let rules = role["rules"].as_array().unwrap();
    let grants = |resource: &str, verb: &str| {
        rules.iter().any(|r| {
            let has = |k: &str, v: &str| r[k].as_array().unwrap().iter().any(|x| x == v);
            has("resources", resource) && has("verbs", verb)
        })
    };
    let evicts = grants("pods/eviction", "create");
    assert!(!grants("pods", "delete"), "the agents never delete pods");
    (
        strategy.collect(),
        roll,
        evicts,
        grants("statefulsets", "watch"),
    )
}

#[test]
fn the_supervised_roll_is_the_default_and_rolling_update_a_value() {
    let (strategy, roll, evicts, reads) = rollout_of(&["shards=2", "replicas=2"]);
    assert_eq!(strategy, ["OnDelete", "OnDelete"]);
    assert_eq!((roll.as_deref(), evicts, reads), (Some("1:3"), true, true));
    let more = rollout_of(&["rollout.maxShardsRolling=2"]);
    assert_eq!(more.1.as_deref(), Some("2:2"));
    let (strategy, roll, evicts, reads) = rollout_of(&["rollout.strategy=RollingUpdate"]);
    assert!(
        strategy.iter().all(|s| s == "RollingUpdate"),
        "{strategy:?}"
    );
    assert_eq!((roll, evicts, reads), (None, false, false));
    // A shard without replicas has nothing to hand over to: the StatefulSet rolls it.
    let (strategy, roll, ..) = rollout_of(&["replicas=0"]);
    assert!(
        strategy.iter().all(|s| s == "RollingUpdate"),
        "{strategy:?}"
    );
    assert_eq!(roll, None);
    assert!(render_sets(&["rollout.strategy=Recreate"]).is_err());
    assert!(render_sets(&["rollout.maxShardsRolling=0"]).is_err());
}

/// The admission policy caps the record format an agent may write at the agents' own
/// (`core::format::FORMAT`): a lower cap would refuse their writes, a higher one would let a
/// stolen token write a format every agent ignores.
#[test]
fn the_admission_policy_caps_the_record_format_at_the_agents_own() {
    let template = std::fs::read_to_string(
        valkey_sidecar_testkit::repo_root()
            .join("charts/valkey-sidecar/templates/admission-policy.yaml"),
    )
    .unwrap();
    let want = format!(
        "{{{{- $format := {} }}}}",
        valkey_sidecar_core::format::FORMAT
    );
    assert!(template.contains(&want), "the policy lacks {want}");
    let rendered = render_sets(&["profile=cluster"]).unwrap();
    let cap = format!(
        "int(variables.format) <= {}",
        valkey_sidecar_core::format::FORMAT
    );
    assert!(rendered.contains(&cap), "the rendered policy lacks {cap}");
}
