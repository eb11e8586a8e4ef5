//! The demo: a real Kubernetes control plane (v1.37.2) with six fake nodes in three zones, and a
//! Valkey Cluster of 3 shards × (1 primary + 1 replica) as process-backed pods, each with the
//! `valkey-sidecar` agent beside Valkey. Prints a live table of the pods every 2 s until Ctrl-C.
//!
//! ```text
//! cargo run -p valkey-sidecar-testkit --bin demo [-- --once | --seconds N]
//! ```
//!
//! `--once`: print the table once everything is Ready, then tear down and exit (used by a test).
//! `--seconds N`: run for N seconds, then tear down. The agent binary comes from
//! `$VALKEY_SIDECAR_BIN`, else from next to this binary (`cargo build --bin valkey-sidecar`).
#![forbid(unsafe_code)]

mod table;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use valkey_sidecar_testkit::k8s::valkey::{
    ValkeyPodTemplate, apply_agent_rbac, cmd, valkey_pod, wait_valkey_up,
};
use valkey_sidecar_testkit::k8s::{
    ControlPlane, ControlPlaneOptions, FakeNodes, FakeNodesOptions, Kubelet, KubeletOptions,
    kubectl_bin,
};

const NAMESPACE: &str = "demo";
const SHARDS: usize = 3;
const MEMBERS: usize = 2;
const REFRESH: Duration = Duration::from_secs(2);
const READY_TIMEOUT: Duration = Duration::from_secs(90);

#[derive(Debug, Default)]
struct Args {
    once: bool,
    /// Only the control plane, nodes and kubelet: a local Kubernetes to point kubectl at.
    plane_only: bool,
    seconds: Option<u64>,
}

fn parse_args() -> Result<Args> {
    let mut args = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--once" => args.once = true,
            "--plane-only" => args.plane_only = true,
            "--seconds" => {
                let n = it.next().context("--seconds needs a number")?;
                args.seconds = Some(n.parse().with_context(|| format!("--seconds {n}"))?);
            }
            "-h" | "--help" => {
                println!("usage: demo [--once] [--seconds N] [--plane-only]");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other} (try --help)"),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let result = parse_args().and_then(|args| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the tokio runtime")?
            .block_on(run_until_signal(args))
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("demo failed: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the demo; Ctrl-C or SIGTERM drops it mid-way, and the `Drop`s tear everything down.
async fn run_until_signal(args: Args) -> Result<()> {
    tokio::select! {
        result = run(args) => result,
        signal = shutdown_signal() => {
            signal?;
            eprintln!("\ninterrupted: tearing down");
            Ok(())
        }
    }
}

async fn shutdown_signal() -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    Ok(())
}

async fn run(args: Args) -> Result<()> {
    let t0 = Instant::now();
    say(
        "starting etcd, kube-apiserver, kube-scheduler and kube-controller-manager (Kubernetes v1.37.2)",
    );
    let plane = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let t = plane.timings();
    say(&format!(
        "control plane up in {:.1?} (etcd {:.1?}, apiserver {:.1?}, scheduler {:.1?}, controller-manager {:.1?})",
        t.total,
        t.etcd,
        t.apiserver,
        t.scheduler.unwrap_or_default(),
        t.controller_manager.unwrap_or_default()
    ));
    let nodes = FakeNodes::start(plane.client(), FakeNodesOptions::default()).await?;
    nodes.wait_ready(Duration::from_secs(60)).await?;
    say(
        "6 nodes Ready: node-a1/a2 in zone-a, node-b1/b2 in zone-b, node-c1/c2 in zone-c (region-1)",
    );
    let kubelet = Kubelet::start(&plane, &nodes, KubeletOptions::default()).await?;
    if args.plane_only {
        return plane_only(&plane, &args).await;
    }
    let names = create_pods(&plane).await?;
    let pods: Api<Pod> = Api::namespaced(plane.client(), NAMESPACE);
    let created = Instant::now();
    let addrs = wait_valkey_up(&pods, &names, READY_TIMEOUT).await?;
    say(&format!(
        "pods placed by kube-scheduler, Valkey answering on every pod IP {:.1?} after creation; \
         the agents form the Valkey Cluster",
        created.elapsed()
    ));
    let forming = Instant::now();
    wait_cluster_ok(&addrs, Duration::from_secs(60)).await?;
    say(&format!(
        "cluster_state:ok on every node {:.1?} later (pod 0 of each shard took a third of the slots, the others replicate it)",
        forming.elapsed()
    ));
    for name in &names {
        kubelet.wait_ready(NAMESPACE, name, READY_TIMEOUT).await?;
    }
    say(&format!(
        "all 6 pods Ready (agent /readyz) {:.1?} after start",
        t0.elapsed()
    ));
    print_kubectl_hint(&plane)?;
    show(&plane, &args).await?;
    say("tearing down (pods, nodes, control plane)");
    drop(kubelet);
    drop(nodes);
    drop(plane);
    Ok(())
}

/// `--plane-only`: control plane, nodes and the process kubelet, until interrupted (or `--seconds`).
async fn plane_only(plane: &ControlPlane, args: &Args) -> Result<()> {
    print_kubectl_hint(plane)?;
    say(
        "control plane, 6 nodes and the process kubelet are up; pods you create run as local processes",
    );
    match args.seconds {
        Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
        None => std::future::pending::<()>().await,
    }
    Ok(())
}

/// Namespace, ServiceAccount and RBAC as the chart would create them, then the six pods
/// (no `nodeName`: the scheduler places them).
async fn create_pods(plane: &ControlPlane) -> Result<Vec<String>> {
    // The coordinator on, and forming the cluster: the agents do it, not the demo.
    let env = [
        ("SIDECAR_CLUSTER_NAME", "valkey"),
        ("SIDECAR_CLUSTER_SHARDS", "3"),
    ];
    let template = ValkeyPodTemplate {
        cluster: "valkey".into(),
        service_account: "valkey".into(),
        sidecar_env: env.map(|(k, v)| (k.to_owned(), v.to_owned())).to_vec(),
        ..ValkeyPodTemplate::default()
    };
    apply_agent_rbac(&plane.client(), NAMESPACE, &template.service_account).await?;
    let pods: Api<Pod> = Api::namespaced(plane.client(), NAMESPACE);
    let mut names = Vec::new();
    for shard in 0..SHARDS {
        for member in 0..MEMBERS {
            let pod = valkey_pod(&template, shard, member)?;
            pods.create(&PostParams::default(), &pod)
                .await
                .with_context(|| format!("creating {}", template.pod_name(shard, member)))?;
            names.push(template.pod_name(shard, member));
        }
    }
    say(&format!(
        "created namespace {NAMESPACE}, ServiceAccount valkey with the agent's RBAC, and 6 pods"
    ));
    Ok(names)
}

fn print_kubectl_hint(plane: &ControlPlane) -> Result<()> {
    let kubectl = kubectl_bin()?;
    println!(
        "\nPoint kubectl at it (another terminal):\n  export KUBECONFIG={}\n  alias kubectl={}\n  \
         kubectl get nodes,pods -n {NAMESPACE} -o wide -L valkey.io/role,valkey.io/shard-id,topology.kubernetes.io/zone\n",
        plane.kubeconfig_path().display(),
        kubectl.display()
    );
    Ok(())
}

/// The live table every 2 s: once with `--once`, for `--seconds`, else until interrupted.
async fn show(plane: &ControlPlane, args: &Args) -> Result<()> {
    let deadline = args
        .seconds
        .map(|s| Instant::now() + Duration::from_secs(s));
    let clear = std::io::stdout().is_terminal() && !args.once;
    loop {
        let table = table::render(&plane.client(), NAMESPACE).await?;
        if clear {
            print!("\x1b[2J\x1b[H");
        }
        println!(
            "pods in namespace {NAMESPACE} (ROLE/SHARD-ID: pod labels; * = from the agent's /status, no label yet)\n{table}\n"
        );
        if args.once || deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(());
        }
        tokio::time::sleep(REFRESH).await;
    }
}

fn say(line: &str) {
    println!("[demo] {line}");
}

/// Waits until every node reports `cluster_state:ok` (the agents form the cluster).
async fn wait_cluster_ok(addrs: &[std::net::SocketAddr], timeout: Duration) -> Result<()> {
    let addrs = addrs.to_vec();
    valkey_sidecar_testkit::k8s::poll_until(
        "cluster_state:ok everywhere",
        timeout,
        Duration::from_millis(100),
        || {
            let addrs = addrs.clone();
            async move {
                let ok = tokio::task::spawn_blocking(move || {
                    addrs.iter().all(|a| {
                        let info = cmd(*a, &["CLUSTER", "INFO"]).and_then(|v| {
                            Ok(valkey_sidecar_testkit::redis::from_redis_value::<String>(
                                v,
                            )?)
                        });
                        info.is_ok_and(|t| t.contains("cluster_state:ok"))
                    })
                });
                Ok(ok.await?)
            }
        },
    )
    .await
}
