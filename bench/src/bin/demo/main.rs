//! The demo: a real Kubernetes control plane (v1.37.2) with six fake nodes in three zones, and the
//! chart (`charts/valkey-sidecar`, 3 shards × (1 primary + 1 replica)) installed into it: the
//! controller-manager creates the pods, the scheduler places them, the process kubelet runs the
//! chart's Valkey and agent containers, and the agents form the Valkey Cluster. Then a `helm upgrade`
//! of a Valkey setting, rolled by the agents' coordinator (replicas first, each primary handed over
//! once) while the live table shows it; then the live table every 2 s until Ctrl-C.
//!
//! ```text
//! cargo run -p valkey-sidecar-bench --bin demo [-- --once | --seconds N]
//! ```
//!
//! `--once`: print the table once everything is Ready, then tear down and exit (no upgrade).
//! `--seconds N`: run for N seconds, then tear down. The agent binary comes from
//! `$VALKEY_SIDECAR_BIN`, else from next to this binary (`cargo build --bin valkey-sidecar`).
#![forbid(unsafe_code)]
// Testkit and bench are read and changed as often as the agent: the same length limit.
#![warn(clippy::too_many_lines)]

mod table;

use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use valkey_sidecar_testkit::k8s::{
    ControlPlane, ControlPlaneOptions, FakeNodes, FakeNodesOptions, Kubelet, KubeletOptions, Stage,
    StageOptions, kubectl_bin,
};

const NAMESPACE: &str = "demo";
const REFRESH: Duration = Duration::from_secs(2);
const READY_TIMEOUT: Duration = Duration::from_secs(120);

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
    if args.plane_only {
        return plane_only(&args).await;
    }
    let t0 = Instant::now();
    say(
        "starting etcd, kube-apiserver, kube-scheduler and kube-controller-manager (Kubernetes v1.37.2), 6 nodes over 3 zones, and installing the chart",
    );
    let mut opts = StageOptions::example(NAMESPACE, "cluster-3x1");
    // A helm release, so the demo can `helm upgrade` it.
    opts.helm_install = true;
    let stage = Stage::install(opts).await?;
    let t = stage.plane.timings();
    say(&format!(
        "control plane up in {:.1?} (etcd {:.1?}, apiserver {:.1?}, scheduler {:.1?}, controller-manager {:.1?}); \
         chart applied {:.1?} after start (examples/cluster-3x1.yaml: StatefulSets, Services, budgets, RBAC, admission policies)",
        t.total,
        t.etcd,
        t.apiserver,
        t.scheduler.unwrap_or_default(),
        t.controller_manager.unwrap_or_default(),
        t0.elapsed()
    ));
    let count = stage.pods.len();
    stage.wait_valkey_up(count, READY_TIMEOUT).await?;
    say(&format!(
        "{count} pods created by the StatefulSets, placed by kube-scheduler, Valkey answering {:.1?} after start; the agents form the Valkey Cluster",
        t0.elapsed()
    ));
    stage.wait_settled(count, count / 2, READY_TIMEOUT).await?;
    say(&format!(
        "cluster formed, all {count} pods Ready (agent /readyz) and labelled {:.1?} after start",
        t0.elapsed()
    ));
    print_kubectl_hint(&stage.plane)?;
    if !args.once {
        upgrade(&stage).await?;
    }
    show(&stage.plane, &args).await?;
    say("tearing down (pods, nodes, control plane)");
    drop(stage);
    Ok(())
}

/// `--plane-only`: control plane, nodes and the process kubelet, until interrupted (or `--seconds`).
async fn plane_only(args: &Args) -> Result<()> {
    let plane = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let nodes = FakeNodes::start(plane.client(), FakeNodesOptions::default()).await?;
    nodes.wait_ready(Duration::from_secs(60)).await?;
    let _kubelet = Kubelet::start(&plane, &nodes, KubeletOptions::default()).await?;
    print_kubectl_hint(&plane)?;
    say(
        "control plane, 6 nodes and the process kubelet are up; pods you create run as local processes",
    );
    match args.seconds {
        Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
        None => std::future::pending::<()>().await,
    }
    Ok(())
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

/// A `helm upgrade` of a Valkey setting, with the live table until every pod runs the new
/// revision: the agents' coordinator evicts the replicas first, one at a time, then hands each
/// primary over once to an updated replica.
async fn upgrade(stage: &Stage) -> Result<()> {
    let setting = "valkey.extraArgs={--maxmemory,2gb,--maxmemory-policy,allkeys-lru}";
    say(&format!(
        "helm upgrade --set '{setting}': the coordinator rolls it (replicas first, one at a time, then each primary handed over once)"
    ));
    let t = Instant::now();
    stage.upgrade(&[setting])?;
    let rolled = stage.wait_rolled(Duration::from_secs(600));
    tokio::pin!(rolled);
    let clear = std::io::stdout().is_terminal();
    loop {
        print_table(&stage.plane, clear).await?;
        tokio::select! {
            done = &mut rolled => { done?; break; }
            () = tokio::time::sleep(REFRESH) => {}
        }
    }
    let events = stage.events().await?;
    let count = |reason: &str| events.lines().filter(|l| l.starts_with(reason)).count();
    say(&format!(
        "rolled in {:.1?}: {} pods evicted and re-created, {} primary hand-overs (kubectl get events -n {NAMESPACE})",
        t.elapsed(),
        count("RollEvictedPod"),
        count("RollStarted")
    ));
    Ok(())
}

async fn print_table(plane: &ControlPlane, clear: bool) -> Result<()> {
    let table = table::render(&plane.client(), NAMESPACE).await?;
    if clear {
        print!("\x1b[2J\x1b[H");
    }
    println!(
        "pods in namespace {NAMESPACE} (ROLE/SHARD-ID: pod labels; * = from the agent's /status, no label yet)\n{table}\n"
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
        print_table(plane, clear).await?;
        if args.once || deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(());
        }
        tokio::time::sleep(REFRESH).await;
    }
}

fn say(line: &str) {
    println!("[demo] {line}");
}
