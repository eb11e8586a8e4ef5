//! Wiring: builds the pieces from the configuration and runs them until shutdown.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::{self, BoxFuture, LocalBoxFuture, join_all};
use tokio::net::TcpListener;
use tokio::sync::watch;
use valkey_sidecar_core::health::HealthState;
use valkey_sidecar_core::heartbeat::{PeerSight, Promise};
use valkey_sidecar_core::lease::{LeaseTimings, election_identity};
use valkey_sidecar_core::observation::Mode;
use valkey_sidecar_core::placement::Placement;
use valkey_sidecar_core::quorum::QuorumPolicy;
use valkey_sidecar_core::replication::Claim;
use valkey_sidecar_core::replication::FailoverPolicy;
use valkey_sidecar_core::restart::{self, Permit};

use crate::cli::config::{Config, CoordinatorConfig, KubeConfig};
use crate::cli::features::{self, Off};
use crate::coordinator::Coordinator;
use crate::coordinator::execute::Elections;
use crate::http::{self, App};
use crate::k8s::events::{Recorder, Reporter, pod_reference};
use crate::k8s::format::FormatNotice;
use crate::k8s::labeler::Labeler;
use crate::k8s::lease::{
    self, CoordinatorTerm, FormedMarker, LeaseClient, RequestCell, StatusAnnotations, SuccessorCell,
};
use crate::k8s::owner::{Anchor, LeaseOwner};
use crate::k8s::{FIELD_MANAGER, KubeError};
use crate::keeper::{Keeper, KeeperBeats, RecordSeed};
use crate::observer::Observer;
use crate::peers::heartbeat::{Heartbeat, ShardLinks};
use crate::peers::quorum::QuorumFence;
use crate::restart::guard::StartGuard;
use crate::runtime::clock::Clock;
use crate::runtime::metrics::Metrics;
use crate::runtime::supervise::{RESTARTS, supervised};
use crate::valkey::{Connector, tls};

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Tls(#[from] tls::TlsSetupError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot install signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Kube(#[from] KubeError),
}

impl StartError {
    /// Exit code: 64 for configuration the user must fix, 69 (`EX_UNAVAILABLE`) otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            StartError::Tls(_) | StartError::Kube(_) => crate::cli::exit::CONFIG,
            _ => crate::cli::exit::UNAVAILABLE,
        }
    }
}

/// What every task shares.
struct Shared {
    clock: Clock,
    metrics: Arc<Metrics>,
    state: watch::Receiver<HealthState>,
    shutdown: watch::Receiver<bool>,
    connector: Connector,
    /// Replication mode with a coordinator: whether the keeper may advertise its Valkey as
    /// primary (a valid renewal of the record, no fence). `None` elsewhere.
    claim: Option<(watch::Sender<bool>, watch::Receiver<bool>)>,
    /// The keeper asks the observer to poll fast while a promotion of its Valkey is due.
    hurry: (watch::Sender<bool>, watch::Receiver<bool>),
    /// The keeper's view of its shard record, which the coordinator starts from.
    seed: (watch::Sender<RecordSeed>, watch::Receiver<RecordSeed>),
    /// Cluster mode: whether a start of the local Valkey may go ahead (`start_guard`).
    start: Option<(watch::Sender<Permit>, watch::Receiver<Permit>)>,
    /// Features that are off, for `/status`: the configuration's, and Nodes once found unreadable.
    off: watch::Sender<Vec<Off>>,
    /// The peer heartbeats' channels; `None` when they are off.
    beats: Option<Beats>,
    /// The coordinator's term, from the election: the observer reads the whole cluster map on
    /// every tick while it leads.
    lead: watch::Sender<CoordinatorTerm>,
}

/// What the heartbeat task shares with the fences (`crate::peers::heartbeat`).
#[derive(Clone)]
struct Beats {
    sight: watch::Sender<Option<PeerSight>>,
    promise: watch::Sender<Option<Promise>>,
    members: watch::Sender<BTreeMap<String, IpAddr>>,
    claim: watch::Sender<Option<Claim>>,
}

impl Beats {
    fn new() -> Beats {
        Beats {
            sight: watch::Sender::new(None),
            promise: watch::Sender::new(None),
            members: watch::Sender::new(BTreeMap::new()),
            claim: watch::Sender::new(None),
        }
    }

    /// The keeper's side.
    fn keeper(&self) -> KeeperBeats {
        KeeperBeats {
            members: self.members.clone(),
            claim: self.claim.clone(),
            sight: self.sight.subscribe(),
            promise: self.promise.subscribe(),
        }
    }
}

type Task = LocalBoxFuture<'static, ()>;

/// The Leases' owner (`k8s::owner`), awaited by every task that writes a Lease.
type Owner = future::Shared<BoxFuture<'static, LeaseOwner>>;

/// Runs the agent until SIGTERM/SIGINT.
pub async fn run(config: Config) -> Result<(), StartError> {
    let shutdown = crate::runtime::lifecycle::shutdown_on_signals().map_err(StartError::Signals)?;
    let clock = Clock::start();
    let (state_tx, state) = watch::channel(HealthState::new(clock.now()));
    let configured = Placement {
        zone: config.identity.zone.clone(),
        region: config.identity.region.clone(),
    };
    let (placement_tx, placement_rx) = watch::channel(configured);
    let shared = Shared {
        clock,
        metrics: Arc::new(Metrics::new()),
        state,
        shutdown,
        connector: connector(&config)?,
        claim: keeps_record(&config).then(|| watch::channel(false)),
        hurry: watch::channel(false),
        seed: watch::channel(None),
        start: (config.mode == Mode::Cluster).then(|| watch::channel(restart::decide(None, None))),
        off: watch::Sender::new(config.off.clone()),
        beats: heartbeats_run(&config).then(Beats::new),
        lead: watch::Sender::new(CoordinatorTerm::default()),
    };
    features::announce(&config.off);
    let mut tasks = serve(&config, &shared).await?;
    let observer = observer(&config, &shared, state_tx, placement_rx);
    tasks.push(supervised_task("observer", &shared, move |stop| {
        observer.clone().run(stop)
    }));
    tasks.extend(local_tasks(&config, &shared));
    if let Some(kube) = &config.kube {
        tasks.extend(kube_tasks(&config, kube, &shared, placement_tx).await?);
    }
    tracing::info!(probe = %config.probe_addr, admin = %config.admin_addr, valkey = %format!("{}:{}", config.valkey.host, config.valkey.port), mode = ?config.mode, "valkey-sidecar started");
    join_all(tasks).await;
    tracing::info!("stopped");
    Ok(())
}

/// The observation loop (with cluster mode's quorum fence).
fn observer(
    config: &Config,
    shared: &Shared,
    state: watch::Sender<HealthState>,
    placement: watch::Receiver<Placement>,
) -> Observer {
    Observer {
        connector: shared.connector.clone(),
        mode: config.mode,
        interval: config.poll_interval,
        bounds: config.bounds,
        clock: shared.clock,
        state,
        metrics: shared.metrics.clone(),
        placement,
        zone_file: config.valkey.zone_file.clone(),
        hurry: shared.hurry.1.clone(),
        quorum: (config.mode == Mode::Cluster)
            .then_some(config.quorum_fence)
            .flatten()
            .map(|p| quorum_fence(p, shared)),
        claim: shared.claim.as_ref().map(|(_, rx)| rx.clone()),
        lead: shared.lead.subscribe(),
    }
}

/// The tasks that need no Kubernetes: the heartbeats and cluster mode's start guard.
fn local_tasks(config: &Config, shared: &Shared) -> Vec<Task> {
    let mut tasks = Vec::new();
    if let Some(beat) = heartbeat(config, shared) {
        tasks.push(supervised_task("heartbeat", shared, move |stop| {
            beat.clone().run(stop)
        }));
    }
    if let Some((permit, _)) = &shared.start {
        let guard = StartGuard {
            state: shared.state.clone(),
            connector: shared.connector.clone(),
            permit: permit.clone(),
            metrics: shared.metrics.clone(),
            silent_since: None,
        };
        tasks.push(supervised_task("start_guard", shared, move |stop| {
            guard.clone().run(stop)
        }));
    }
    tasks
}

/// The probe and admin listeners.
async fn serve(config: &Config, shared: &Shared) -> Result<Vec<Task>, StartError> {
    let probe = listen(config.probe_addr).await?;
    let admin = listen(config.admin_addr).await?;
    let app = Arc::new(App {
        state: shared.state.clone(),
        clock: shared.clock,
        bounds: config.bounds,
        mode: config.mode,
        identity: config.identity.clone(),
        metrics: shared.metrics.clone(),
        claim: shared.claim.as_ref().map(|(_, rx)| rx.clone()),
        start: shared.start.as_ref().map(|(_, rx)| rx.clone()),
        off: shared.off.subscribe(),
    });
    Ok(vec![
        http::serve(probe, app.clone(), shared.shutdown.clone()).boxed_local(),
        http::serve(admin, app, shared.shutdown.clone()).boxed_local(),
    ])
}

/// The pod labeler and, when configured, the Lease election and the coordinator.
async fn kube_tasks(
    config: &Config,
    kube: &KubeConfig,
    shared: &Shared,
    placement: watch::Sender<Placement>,
) -> Result<Vec<Task>, StartError> {
    let client = crate::k8s::client().await?;
    // The Leases' owner for the keeper, the Lease runner and the coordinator: looked up at start,
    // and again whenever one of them creates a Lease.
    let anchor = match &kube.lease_owner {
        Some(name) => Anchor::ConfigMap(name.clone()),
        None => Anchor::ServiceAccountOf(kube.pod_name.clone()),
    };
    let owner = LeaseOwner::resolve(client.clone(), kube.namespace.clone(), anchor)
        .boxed()
        .shared();
    let keeper = keeper(config, kube, shared, &client);
    let labeler = Labeler {
        client: client.clone(),
        config: kube.clone(),
        identity: config.identity.clone(),
        mode: config.mode,
        bounds: config.bounds,
        clock: shared.clock,
        state: shared.state.clone(),
        placement,
        metrics: shared.metrics.clone(),
        claim: keeper.as_ref().map(|(_, claim)| claim.clone()),
    };
    let mut tasks = vec![
        supervised_task("labeler", shared, move |stop| labeler.clone().run(stop)),
        check_nodes(client.clone(), shared.off.clone()).boxed_local(),
    ];
    if let Some((keeper, _)) = keeper {
        let owner = owner.clone();
        tasks.push(supervised_task("keeper", shared, move |stop| {
            let (mut keeper, owner) = (keeper.clone(), owner.clone());
            async move {
                keeper.owner = Some(owner.await);
                keeper.run(stop).await;
            }
        }));
    }
    if let Some(co) = &kube.coordinator {
        tasks.extend(coordinator_tasks(config, kube, co, shared, client, owner));
    }
    Ok(tasks)
}

/// Asks the API once whether Nodes may be read (a few tries while it does not answer) and, if
/// not, says what that turns off: the namespace profile's agents run without them.
async fn check_nodes(client: kube::Client, off: watch::Sender<Vec<Off>>) {
    let mut delays = crate::runtime::retry::few(Duration::from_secs(2), 5);
    loop {
        match crate::k8s::nodes_forbidden(&client, Duration::from_secs(5)).await {
            Some(true) => break,
            Some(false) => return,
            None => match delays.next() {
                Some(d) => tokio::time::sleep(d).await,
                None => return,
            },
        }
    }
    let nodes = features::nodes_unreadable();
    features::announce(std::slice::from_ref(&nodes));
    off.send_modify(|o| o.push(nodes));
}

/// Cluster mode's quorum fence, with the heartbeats' evidence when they run.
fn quorum_fence(policy: QuorumPolicy, shared: &Shared) -> QuorumFence {
    let fence = QuorumFence::new(policy, shared.metrics.clone());
    match &shared.beats {
        Some(b) => fence.with_heartbeats(b.sight.subscribe(), shared.clock),
        None => fence,
    }
}

/// Heartbeats run where a fence acts on them: cluster mode, and replication mode's keepers.
fn heartbeats_run(config: &Config) -> bool {
    let fenced = config.mode == Mode::Cluster || keeps_record(config);
    config.isolation.is_some() && fenced
}

/// The heartbeat task, when heartbeats run.
fn heartbeat(config: &Config, shared: &Shared) -> Option<Heartbeat> {
    let beats = shared.beats.as_ref()?;
    let policy = config.isolation?;
    let shard = (config.mode == Mode::Replication).then(|| ShardLinks {
        members: beats.members.subscribe(),
        claim: beats.claim.subscribe(),
        seed: shared.seed.1.clone(),
    });
    let co = config.kube.as_ref().and_then(|k| k.coordinator.as_ref());
    Some(Heartbeat {
        bind: config.probe_addr,
        cluster: co.map_or_else(|| "valkey".to_owned(), |c| c.cluster.clone()),
        pod: config.identity.pod_name.clone().unwrap_or_default(),
        mode: config.mode,
        policy,
        password: config.valkey.password.clone(),
        clock: shared.clock,
        bounds: config.bounds,
        state: shared.state.clone(),
        shard,
        sight: beats.sight.clone(),
        promise: beats.promise.clone(),
        metrics: shared.metrics.clone(),
    })
}

/// How long a promotion waits for its target's agent: its heartbeat promise (when heartbeats
/// run) plus a renew deadline for the agent to see the record and renew it.
fn consent_ms(config: &Config, timings: LeaseTimings) -> u64 {
    let promise = config.isolation.map_or(0, |p| p.promise_ms());
    promise.saturating_add(timings.renew_deadline_ms)
}

/// Whether this agent keeps a shard record: replication mode with the coordinator on.
fn keeps_record(config: &Config) -> bool {
    let coordinated = config
        .kube
        .as_ref()
        .is_some_and(|k| k.coordinator.is_some());
    config.mode == Mode::Replication && coordinated
}

/// Replication mode with a coordinator: the keeper of this pod's shard record, and the claim it
/// publishes for the labeler and `/primary`.
fn keeper(
    config: &Config,
    kube: &KubeConfig,
    shared: &Shared,
    client: &kube::Client,
) -> Option<(Keeper, watch::Receiver<bool>)> {
    let co = kube.coordinator.as_ref()?;
    let (claim_tx, claim_rx) = shared.claim.clone()?;
    let keeper = Keeper {
        client: client.clone(),
        namespace: kube.namespace.clone(),
        pod: kube.pod_name.clone(),
        cluster: co.cluster.clone(),
        selector: co.pod_selector.clone(),
        timings: co.timings,
        lease_watch: co.lease_watch,
        clock: shared.clock,
        bounds: config.bounds,
        state: shared.state.clone(),
        connector: shared.connector.clone(),
        poll: config.poll_interval,
        metrics: shared.metrics.clone(),
        claim: claim_tx,
        owner: None,
        hurry: shared.hurry.0.clone(),
        recorder: kube
            .events
            .then(|| Recorder::new(client.clone(), reporter(kube))),
        pod_uid: config.identity.pod_uid.clone(),
        seed: shared.seed.0.clone(),
        beats: shared.beats.as_ref().map(Beats::keeper),
    };
    Some((keeper, claim_rx))
}

fn coordinator_tasks(
    config: &Config,
    kube: &KubeConfig,
    co: &CoordinatorConfig,
    shared: &Shared,
    client: kube::Client,
    owner: Owner,
) -> Vec<Task> {
    let (lead_tx, lead_rx) = (shared.lead.clone(), shared.lead.subscribe());
    // The coordinator's status rides along in the Lease holder's renewals.
    let (status_tx, status_rx) = watch::channel(StatusAnnotations::new());
    // A Lease call must finish well inside the renew deadline to be of any use.
    let call_timeout = Duration::from_millis(co.timings.call_limit_ms());
    let lease = LeaseClient::new(
        client.clone(),
        &kube.namespace,
        &co.lease_name,
        call_timeout,
        status_rx,
    );
    // Whether the cluster was formed before, kept on the Lease across holders and restarts.
    let formed = FormedMarker::default();
    // The operator's pause and switchover requests, carried on the Lease by its writer.
    let requests = RequestCell::default();
    let notice = format_notice(config, kube, shared, &client);
    // Who takes over first, named by the coordinator and carried on the Lease.
    let successors = SuccessorCell::default();
    let lease = lease
        .watching(co.lease_watch)
        .naming(successors.clone())
        .remembering(formed.clone())
        .asked(requests.clone())
        .telling(notice.clone());
    let mut coordinator = coordinator(config, kube, co, shared, client, (lead_rx, status_tx));
    coordinator.formed = formed;
    coordinator.successors = successors;
    coordinator.requests = requests;
    coordinator.notice = notice;
    let identity = election_identity(&kube.pod_name, config.identity.pod_uid.as_deref());
    let (timings, clock, elect_owner) = (co.timings, shared.clock, owner.clone());
    let elect = supervised_task("election", shared, move |stop| {
        let (lease, owner) = (lease.clone(), elect_owner.clone());
        let (identity, lead_tx) = (identity.clone(), lead_tx.clone());
        async move {
            let lease = lease.owned_by(Some(owner.await));
            lease::run(lease, identity, timings, clock, lead_tx, stop).await;
        }
    });
    let act = supervised_task("coordinator", shared, move |stop| {
        let (mut coordinator, owner) = (coordinator.clone(), owner.clone());
        async move {
            coordinator.lease_owner = Some(owner.await);
            coordinator.run(stop).await;
        }
    });
    vec![elect, act]
}

/// A task that `start` builds afresh from clones whenever the previous one panicked
/// ([`supervised`]).
fn supervised_task<F, Fut>(name: &'static str, shared: &Shared, start: F) -> Task
where
    F: Fn(watch::Receiver<bool>) -> Fut + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let stop = shared.shutdown.clone();
    let make = move || start(stop.clone()).boxed_local();
    supervised(
        name,
        shared.metrics.clone(),
        shared.shutdown.clone(),
        RESTARTS,
        make,
    )
    .boxed_local()
}

/// Where a record of an unknown format is told: metrics, log, an Event on the agent's own pod.
fn format_notice(
    config: &Config,
    kube: &KubeConfig,
    shared: &Shared,
    client: &kube::Client,
) -> FormatNotice {
    let uid = config.identity.pod_uid.clone();
    let pod = pod_reference(&kube.pod_name, &kube.namespace, uid);
    let events = kube
        .events
        .then(|| (Recorder::new(client.clone(), reporter(kube)), pod));
    FormatNotice::new(shared.metrics.clone(), events)
}

/// Who the agent's Events say reported them.
fn reporter(kube: &KubeConfig) -> Reporter {
    Reporter {
        controller: FIELD_MANAGER.into(),
        instance: Some(kube.pod_name.clone()),
    }
}

fn coordinator(
    config: &Config,
    kube: &KubeConfig,
    co: &CoordinatorConfig,
    shared: &Shared,
    client: kube::Client,
    (term, status): (
        watch::Receiver<CoordinatorTerm>,
        watch::Sender<StatusAnnotations>,
    ),
) -> Coordinator {
    Coordinator {
        client: client.clone(),
        namespace: kube.namespace.clone(),
        selector: co.pod_selector.clone(),
        clock: shared.clock,
        mode: config.mode,
        cluster: co.cluster.clone(),
        timings: co.timings,
        failover: FailoverPolicy::default(),
        consent_ms: consent_ms(config, co.timings),
        bounds: config.bounds,
        state: shared.state.clone(),
        term,
        policy: co.policy.clone(),
        connector: shared.connector.clone(),
        handover_timeout: co.handover_timeout,
        elections: Elections::default(),
        role_label: kube.policy.role_key.clone(),
        primary_value: kube.policy.primary_value.clone(),
        recorder: kube.events.then(|| Recorder::new(client, reporter(kube))),
        metrics: shared.metrics.clone(),
        status,
        seed: shared.seed.1.clone(),
        formation_shards: co.formation_shards,
        formed: FormedMarker::default(),
        successors: SuccessorCell::default(),
        lease_owner: None,
        requests: RequestCell::default(),
        operator: co.operator.clone(),
        notice: FormatNotice::default(),
    }
}

fn connector(config: &Config) -> Result<Connector, StartError> {
    let v = &config.valkey;
    Ok(Connector {
        host: v.host.clone(),
        port: v.port,
        username: v.username.clone(),
        password: v.password.clone(),
        tls: v.tls.as_ref().map(tls::build).transpose()?,
        timeout: v.timeout,
    })
}

/// A listener with a deep accept queue: under a connection flood the kubelet's probe must still
/// find room in it (the kernel caps the depth at `net.core.somaxconn`).
async fn listen(addr: std::net::SocketAddr) -> Result<TcpListener, StartError> {
    let bind = || {
        let socket = match addr {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(4096)
    };
    bind().map_err(|source| StartError::Listen { addr, source })
}
