//! The process-backed kubelet against a real control plane: crash and restart, pause and resume,
//! probes on the pod's own schedule, the crash-loop back-off, a terminating pod, an exec preStop
//! hook; the node faults (power-off, partition, freeze) with real clients on both sides; and the
//! pod shape a Helm chart renders: init containers, the agent as a native sidecar, volumes (a
//! Secret's file reaching the agent through its environment), ordered termination. Pods are bound
//! directly (`nodeName`, no scheduler).
//!
//! These are tests of the harness itself, on small pods written for the mechanism under test (a
//! pinned node, two processes that crash and restart, a probe to time): the product's pod is the
//! chart's, which every test of the agent runs through `testkit::k8s::Stage`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerStatus, Node, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;
use valkey_sidecar_testkit::k8s::{
    ControlPlane, ControlPlaneOptions, FakeNodes, FakeNodesOptions, Kubelet, KubeletOptions,
    http_get, pod_condition, pod_is_ready, poll_until, process_alive,
};
use valkey_sidecar_testkit::redis;

const NS: &str = "default";
const SECOND: Duration = Duration::from_secs(1);
const POLL: Duration = Duration::from_millis(50);
/// The real kubelet's first crash-loop back-off step.
const FIRST_BACK_OFF: Duration = Duration::from_secs(10);

/// Two processes on a pinned node (a server, and the agent for an HTTP readiness probe that stops
/// answering when the pod is frozen) — the smallest pod to crash, pause and power off.
fn two_process_pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 5,
            "volumes": [{ "name": "scratch", "emptyDir": {} }],
            "containers": [
                {
                    "name": "valkey", "image": "valkey/valkey:9.1.2",
                    "volumeMounts": [{ "name": "scratch", "mountPath": "/scratch" }],
                },
                {
                    "name": "sidecar",
                    "image": "valkey-sidecar:dev",
                    "env": [
                        { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                        { "name": "VALKEY_ADDR", "value": "localhost:6379" },
                        { "name": "SIDECAR_MODE", "value": "replication" },
                        { "name": "SIDECAR_POLL_INTERVAL", "value": "100ms" },
                    ],
                    "readinessProbe": { "httpGet": { "path": "/readyz", "port": 9736 },
                                        "periodSeconds": 1 },
                },
            ],
        },
    }))
    .unwrap()
}

/// Valkey alone, Ready once it accepts connections.
fn plain_valkey_pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "valkey", "image": "valkey/valkey:9.1.2",
                "readinessProbe": { "tcpSocket": { "port": 6379 }, "periodSeconds": 1 },
            }],
        },
    }))
    .unwrap()
}

async fn wait_named(pods: &Api<Pod>, name: &str, what: &str, cond: impl Fn(&Pod) -> bool) {
    poll_until(what, 30 * SECOND, POLL, || async {
        Ok(cond(&pods.get(name).await?))
    })
    .await
    .unwrap();
}

async fn wait_pod(pods: &Api<Pod>, what: &str, cond: impl Fn(&Pod) -> bool) -> Duration {
    let start = Instant::now();
    wait_named(pods, "chaos", what, cond).await;
    start.elapsed()
}

/// Waits until every process of `pids` is gone: SIGKILL (and `cgroup.kill`, which only queues
/// it) ends a process when it is next scheduled, not at once.
async fn all_dead(pids: &[u32], what: &str) {
    poll_until(what, 5 * SECOND, POLL, || async {
        Ok(pids.iter().all(|p| !process_alive(*p)))
    })
    .await
    .unwrap();
}

async fn wait_node(nodes: &Api<Node>, name: &str, status: &str) -> Duration {
    let start = Instant::now();
    poll_until(
        &format!("{name} Ready={status}"),
        30 * SECOND,
        POLL,
        || async {
            let node = nodes.get(name).await?;
            let ready = node
                .status
                .and_then(|s| s.conditions)
                .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready").map(|c| c.status));
            Ok(ready.as_deref() == Some(status))
        },
    )
    .await
    .unwrap();
    start.elapsed()
}

fn ready(pod: &Pod) -> bool {
    pod_condition(pod, "Ready") == Some(true)
}

fn status(pod: &Pod, container: &str) -> Option<ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == container)
        .cloned()
}

fn restarts(pod: &Pod, container: &str) -> i32 {
    status(pod, container).map_or(-1, |c| c.restart_count)
}

/// `(reason, message)` of the container's waiting state, if it waits.
fn waiting(pod: &Pod, container: &str) -> Option<(String, String)> {
    let w = status(pod, container)?.state?.waiting?;
    Some((w.reason.unwrap_or_default(), w.message.unwrap_or_default()))
}

/// A control plane without scheduler whose node-lifecycle controller gives up on a silent node
/// after 5 s, six nodes beating every 500 ms, and the kubelet with its defaults.
async fn cluster() -> (ControlPlane, FakeNodes, Kubelet) {
    let opts = ControlPlaneOptions {
        scheduler: false,
        node_monitor_grace_period: 5 * SECOND,
        ..ControlPlaneOptions::default()
    };
    let plane = ControlPlane::start(opts).await.unwrap();
    let node_opts = FakeNodesOptions {
        heartbeat: Duration::from_millis(500),
        ..FakeNodesOptions::default()
    };
    let nodes = FakeNodes::start(plane.client(), node_opts).await.unwrap();
    nodes.wait_ready(30 * SECOND).await.unwrap();
    let kubelet = Kubelet::start(&plane, &nodes, KubeletOptions::default())
        .await
        .unwrap();
    (plane, nodes, kubelet)
}

/// One command over a fresh connection from `source` (or the default source), each step within
/// 1 s: the first reply line, or what went wrong (`connect timed out`, `read timed out`, …).
async fn try_cmd(source: Option<Ipv4Addr>, to: SocketAddr, cmd: &[&str]) -> Result<String, String> {
    let socket = TcpSocket::new_v4().unwrap();
    if let Some(ip) = source {
        socket.bind((ip, 0).into()).unwrap();
    }
    let mut stream = match tokio::time::timeout(SECOND, socket.connect(to)).await {
        Err(_) => return Err("connect timed out".into()),
        Ok(Err(e)) => return Err(format!("connect: {e}")),
        Ok(Ok(s)) => s,
    };
    let mut request = format!("*{}\r\n", cmd.len());
    for arg in cmd {
        request.push_str(&format!("${}\r\n{arg}\r\n", arg.len()));
    }
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = [0u8; 512];
    match tokio::time::timeout(SECOND, stream.read(&mut buf)).await {
        Err(_) => Err("read timed out".into()),
        Ok(Err(e)) => Err(format!("read: {e}")),
        Ok(Ok(0)) => Err("closed".into()),
        Ok(Ok(n)) => Ok(String::from_utf8_lossy(&buf[..n]).trim().to_owned()),
    }
}

/// The one-letter state of a process (`S`, `R`, `T` for stopped, …).
fn process_state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = stat.rsplit_once(')').unwrap().1.trim_start();
    rest.chars().next().unwrap()
}

/// The apiserver's port, from its URL.
fn apiserver_port(plane: &ControlPlane) -> u16 {
    plane.url().rsplit(':').next().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_pause_power_off_and_exec_hooks() {
    let (plane, nodes, kubelet) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(plane.client(), NS);
    let node_api: Api<Node> = Api::all(plane.client());
    pods.create(&PostParams::default(), &two_process_pod("chaos", "node-a1"))
        .await
        .unwrap();
    kubelet.wait_ready(NS, "chaos", 20 * SECOND).await.unwrap();

    // Crash: valkey dies behind Kubernetes' back; the kubelet restarts it at once (the first
    // restart has no back-off), so the pod need not even turn unready.
    let old = kubelet.container_pid(NS, "chaos", "valkey").unwrap();
    let crashed = Instant::now();
    kubelet.crash_container(NS, "chaos", "valkey").unwrap();
    let back = wait_pod(&pods, "ready after restart", |p| {
        ready(p) && restarts(p, "valkey") == 1
    })
    .await;
    let restarted = kubelet.starts().last().unwrap().at - crashed;
    println!("crash: restarted after {restarted:?}, restartCount 1 and Ready after {back:?}");
    // The first back-off step is 10 s: anything well below it was an immediate restart.
    assert!(restarted < FIRST_BACK_OFF / 2, "{restarted:?}");
    let new = kubelet.container_pid(NS, "chaos", "valkey").unwrap();
    assert_ne!(old, new);
    assert!(!process_alive(old));

    // Pause: probes time out.
    kubelet.pause(NS, "chaos").unwrap();
    let unready = wait_pod(&pods, "unready while paused", |p| !ready(p)).await;
    kubelet.resume(NS, "chaos").unwrap();
    let back = wait_pod(&pods, "ready after resume", ready).await;
    println!("pause: unready after {unready:?}; resume: Ready after {back:?}");

    // Power-off: a client connected to the pod's Valkey hears nothing (no reset) and new
    // connections time out (no refusal); the node goes Unknown, the pod object stays.
    let ip = kubelet.pod_ip(NS, "chaos").unwrap();
    let addr = SocketAddr::from((ip, 6379));
    let scratch = kubelet.volume_dir(NS, "chaos", "scratch").unwrap();
    std::fs::write(scratch.join("marker"), "kept").unwrap();
    let client = redis::Client::open(format!("redis://{addr}")).unwrap();
    let mut con = client.get_connection_with_timeout(SECOND).unwrap();
    con.set_read_timeout(Some(SECOND)).unwrap();
    let pong: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(pong, "PONG");
    let pids = kubelet.pids(NS, "chaos");
    kubelet.power_off("node-a1").unwrap();
    all_dead(&pids, "every process of the node dead").await;
    let (err, took) = tokio::task::spawn_blocking(move || {
        let at = Instant::now();
        let err = redis::cmd("PING").query::<String>(&mut con).unwrap_err();
        (err, at.elapsed())
    })
    .await
    .unwrap();
    assert!(err.is_timeout(), "a read timeout, not {err:?}");
    assert!(took >= SECOND * 9 / 10, "{took:?}");
    let connect = tokio::task::spawn_blocking(move || {
        std::net::TcpStream::connect_timeout(&addr, SECOND).unwrap_err()
    })
    .await
    .unwrap();
    assert_eq!(connect.kind(), std::io::ErrorKind::TimedOut, "{connect:?}");
    println!("power-off: PING timed out after {took:?}, a new connection timed out");
    let unknown = wait_node(&node_api, "node-a1", "Unknown").await;
    println!("power-off node-a1: Ready=Unknown after {unknown:?} (grace 5 s)");
    // The node-lifecycle controller marks the pods of a dead node NotReady.
    wait_pod(&pods, "pod marked NotReady on the dead node", |p| !ready(p)).await;
    assert!(pods.get_opt("chaos").await.unwrap().is_some());
    let starts_before = kubelet.starts().len();

    // Power-on: heartbeat back, containers start again at once, the emptyDir kept.
    let on = Instant::now();
    kubelet.power_on("node-a1").unwrap();
    let node_back = wait_node(&node_api, "node-a1", "True").await;
    let pod_back = wait_pod(&pods, "ready after power-on", |p| {
        ready(p) && restarts(p, "valkey") == 2 && restarts(p, "sidecar") == 1
    })
    .await;
    let restarted = kubelet.starts()[starts_before..].to_vec();
    assert_eq!(restarted.len(), 2, "{restarted:?}");
    let started_after = restarted.iter().map(|s| s.at - on).max().unwrap();
    assert!(started_after < FIRST_BACK_OFF / 2, "{started_after:?}");
    assert_eq!(
        std::fs::read_to_string(scratch.join("marker")).unwrap(),
        "kept"
    );
    println!(
        "power-on: containers started within {started_after:?}, node Ready after {node_back:?}, pod Ready {pod_back:?} later"
    );

    // A node made NotReady on purpose, and back.
    nodes.set_ready("node-b1", false).await.unwrap();
    wait_node(&node_api, "node-b1", "False").await;
    nodes.set_ready("node-b1", true).await.unwrap();
    wait_node(&node_api, "node-b1", "True").await;

    // Set-up errors are reported and retried: a pod whose Secret does not exist yet.
    let orphan: Pod = serde_json::from_value(json!({
        "metadata": { "name": "orphan" },
        "spec": {
            "nodeName": "node-c2",
            "containers": [{
                "name": "pause", "image": "registry.k8s.io/pause:3.10",
                "env": [{ "name": "PASSWORD",
                          "valueFrom": { "secretKeyRef": { "name": "late", "key": "password" } } }],
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &orphan).await.unwrap();
    poll_until("set-up error reported", 20 * SECOND, POLL, || async {
        let pod = pods.get("orphan").await?;
        Ok(pod.status.and_then(|s| s.reason).as_deref() == Some("CreateContainerConfigError"))
    })
    .await
    .unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "late" }, "stringData": { "password": "pw" },
    }))
    .unwrap();
    Api::<Secret>::namespaced(plane.client(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let orphan = kubelet.wait_ready(NS, "orphan", 20 * SECOND).await.unwrap();
    assert_eq!(orphan.status.unwrap().reason, None, "the error is cleared");

    // A placeholder pod with an exec preStop hook.
    let placeholder: Pod = serde_json::from_value(json!({
        "metadata": { "name": "placeholder" },
        "spec": {
            "nodeName": "node-c1",
            "containers": [{
                "name": "pause", "image": "registry.k8s.io/pause:3.10",
                "env": [{ "name": "GREETING", "value": "bye" }],
                "lifecycle": { "preStop": { "exec": { "command": ["sh", "-c", "echo $GREETING"] } } },
            }],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &placeholder)
        .await
        .unwrap();
    kubelet
        .wait_ready(NS, "placeholder", 20 * SECOND)
        .await
        .unwrap();
    pods.delete("placeholder", &DeleteParams::default())
        .await
        .unwrap();
    poll_until("placeholder removed", 20 * SECOND, POLL, || async {
        Ok(pods.get_opt("placeholder").await?.is_none())
    })
    .await
    .unwrap();
    let hook = kubelet
        .hook_runs()
        .into_iter()
        .find(|h| h.pod == "placeholder")
        .unwrap();
    assert_eq!(hook.result, Ok("exit 0 bye".to_string()), "{hook:?}");
}

/// A pause container whose exec probes log when they run: readiness every 2 s, liveness every
/// second, into an emptyDir (the probe's environment names the file; the kubelet rewrites the
/// mount path to the volume's directory).
fn probed_pod(name: &str, node: &str) -> Pod {
    let log = |file: &str| format!("date +%s.%N >> $LOG/{file}");
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": {
            "nodeName": node,
            "volumes": [{ "name": "log", "emptyDir": {} }],
            "containers": [{
                "name": "pause", "image": "registry.k8s.io/pause:3.10",
                "env": [{ "name": "LOG", "value": "/log" }],
                "volumeMounts": [{ "name": "log", "mountPath": "/log" }],
                "readinessProbe": { "exec": { "command": ["sh", "-c", log("readiness")] },
                                    "periodSeconds": 2 },
                "livenessProbe": { "exec": { "command": ["sh", "-c", log("liveness")] },
                                   "periodSeconds": 1 },
            }],
        },
    }))
    .unwrap()
}

/// Seconds between consecutive timestamps in a probe log.
fn gaps(log: &std::path::Path) -> Vec<f64> {
    let text = std::fs::read_to_string(log).unwrap();
    let times: Vec<f64> = text.lines().map(|l| l.parse().unwrap()).collect();
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_periods_crash_loop_back_off_and_termination() {
    let (plane, _nodes, kubelet) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(plane.client(), NS);
    let create = |pod: Pod| {
        let pods = pods.clone();
        async move { pods.create(&PostParams::default(), &pod).await.unwrap() }
    };
    create(probed_pod("probed", "node-a1")).await;
    // Valkey refuses its arguments and exits at once, every time.
    let crashy: Pod = serde_json::from_value(json!({
        "metadata": { "name": "crashy" },
        "spec": { "nodeName": "node-b1", "containers": [{
            "name": "valkey", "image": "valkey/valkey:9.1.2", "args": ["--port", "not-a-port"],
        }]},
    }))
    .unwrap();
    create(crashy).await;
    // A liveness probe that always fails: each failure kills the container.
    let unlive: Pod = serde_json::from_value(json!({
        "metadata": { "name": "unlive" },
        "spec": { "nodeName": "node-c1", "containers": [{
            "name": "pause", "image": "registry.k8s.io/pause:3.10",
            "livenessProbe": { "exec": { "command": ["false"] },
                               "periodSeconds": 1, "failureThreshold": 1 },
        }]},
    }))
    .unwrap();
    create(unlive).await;

    // CrashLoopBackOff: the first restart is immediate, the second waits 10 s; meanwhile the
    // container waits with reason CrashLoopBackOff.
    wait_named(&pods, "crashy", "crashy backing off 10 s", |p| {
        waiting(p, "valkey")
            .is_some_and(|(r, m)| r == "CrashLoopBackOff" && m.starts_with("back-off 10s"))
            && restarts(p, "valkey") == 1
    })
    .await;
    let pod = pods.get("crashy").await.unwrap();
    let last = status(&pod, "valkey")
        .unwrap()
        .last_state
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(last.exit_code, 1, "{last:?}");
    // A liveness kill counts as a crash too.
    wait_named(&pods, "unlive", "unlive backing off", |p| {
        waiting(p, "pause").is_some_and(|(r, _)| r == "CrashLoopBackOff")
    })
    .await;
    let pod = pods.get("unlive").await.unwrap();
    let killed = status(&pod, "pause")
        .unwrap()
        .last_state
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        (killed.exit_code, restarts(&pod, "pause")),
        (137, 1),
        "{killed:?}"
    );

    // Probes run on the pod's schedule: readiness every 2 s, liveness every second.
    kubelet.wait_ready(NS, "probed", 10 * SECOND).await.unwrap();
    let log = kubelet.volume_dir(NS, "probed", "log").unwrap();
    poll_until("crashy restarted twice", 20 * SECOND, POLL, || async {
        Ok(restarts(&pods.get("crashy").await?, "valkey") == 2)
    })
    .await
    .unwrap();
    let readiness = gaps(&log.join("readiness"));
    let liveness = gaps(&log.join("liveness"));
    println!("probe gaps: readiness {readiness:.2?}, liveness {liveness:.2?}");
    assert!(readiness.len() >= 4 && liveness.len() >= 8);
    assert!(
        readiness.iter().all(|g| (1.8..2.4).contains(g)),
        "{readiness:?}"
    );
    assert!(
        liveness.iter().all(|g| (0.8..1.4).contains(g)),
        "{liveness:?}"
    );

    let starts: Vec<Instant> = kubelet
        .starts()
        .into_iter()
        .filter(|s| s.pod == "crashy")
        .map(|s| s.at)
        .collect();
    let (first, second) = (starts[1] - starts[0], starts[2] - starts[1]);
    println!("crash loop: restarted after {first:?}, then after {second:?}");
    assert!(first < SECOND, "{first:?}");
    assert!((10 * SECOND..12 * SECOND).contains(&second), "{second:?}");
    wait_named(&pods, "crashy", "crashy backing off 20 s", |p| {
        waiting(p, "valkey").is_some_and(|(_, m)| m.starts_with("back-off 20s"))
    })
    .await;

    // A terminating pod is not Ready, whatever its condition still says.
    let leaving: Pod = serde_json::from_value(json!({
        "metadata": { "name": "leaving" },
        "spec": { "nodeName": "node-a2", "terminationGracePeriodSeconds": 10, "containers": [{
            "name": "pause", "image": "registry.k8s.io/pause:3.10",
            "lifecycle": { "preStop": { "sleep": { "seconds": 5 } } },
        }]},
    }))
    .unwrap();
    create(leaving).await;
    kubelet
        .wait_ready(NS, "leaving", 10 * SECOND)
        .await
        .unwrap();
    pods.delete("leaving", &DeleteParams::default())
        .await
        .unwrap();
    let pod = pods.get("leaving").await.unwrap();
    assert!(pod.metadata.deletion_timestamp.is_some());
    assert_eq!(
        pod_condition(&pod, "Ready"),
        Some(true),
        "the kubelet leaves it"
    );
    assert!(!pod_is_ready(&pod));
    assert!(kubelet.wait_ready(NS, "leaving", SECOND).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partition_and_freeze_nodes() {
    let (plane, _nodes, kubelet) = cluster().await;
    let pods: Api<Pod> = Api::namespaced(plane.client(), NS);
    let node_api: Api<Node> = Api::all(plane.client());
    for (name, node) in [("left", "node-a1"), ("right", "node-b1")] {
        pods.create(&PostParams::default(), &plain_valkey_pod(name, node))
            .await
            .unwrap();
    }
    kubelet.wait_ready(NS, "left", 20 * SECOND).await.unwrap();
    kubelet.wait_ready(NS, "right", 20 * SECOND).await.unwrap();
    let left = SocketAddr::from((kubelet.pod_ip(NS, "left").unwrap(), 6379));
    let right = SocketAddr::from((kubelet.pod_ip(NS, "right").unwrap(), 6379));
    let on_node = kubelet.node_client_ip("node-a1").unwrap();
    let observer = Some(kubelet.observer_ip());
    let api = format!("exec 3<>/dev/tcp/127.0.0.1/{}", apiserver_port(&plane));
    let to_right = format!("exec 3<>/dev/tcp/{}/6379", right.ip());
    let own = format!(
        "exec 3<>/dev/tcp/{}/6379 && printf 'PING\\r\\n' >&3 && head -c 5 <&3",
        left.ip()
    );
    let in_left = |script: String| {
        let kubelet = &kubelet;
        async move {
            let command = ["timeout", "2", "bash", "-c", script.as_str()];
            let out = kubelet
                .exec(NS, "left", "valkey", &command, 5 * SECOND)
                .await
                .unwrap();
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        }
    };
    assert_eq!(
        in_left(api.clone()).await.0,
        Some(0),
        "the apiserver, before"
    );
    assert_eq!(
        in_left(to_right.clone()).await.0,
        Some(0),
        "the other pod, before"
    );

    // Partition node-a1: only the node itself and the observer still reach its pod.
    kubelet.partition_node("node-a1").unwrap();
    let set = ["SET", "k", "v"];
    assert_eq!(try_cmd(Some(on_node), left, &set).await, Ok("+OK".into()));
    assert_eq!(
        try_cmd(None, left, &set).await,
        Err("connect timed out".into())
    );
    let localhost = Some(Ipv4Addr::LOCALHOST);
    assert_eq!(
        try_cmd(localhost, left, &set).await,
        Err("connect timed out".into())
    );
    assert_eq!(
        try_cmd(Some(on_node), right, &set).await,
        Err("connect timed out".into())
    );
    assert_eq!(try_cmd(observer, left, &set).await, Ok("+OK".into()));
    assert_eq!(try_cmd(observer, right, &set).await, Ok("+OK".into()));
    assert_eq!(try_cmd(None, right, &set).await, Ok("+OK".into()));
    // From inside: the pod reaches its own Valkey, not the apiserver nor the other pod.
    assert_eq!(in_left(own.clone()).await, (Some(0), "+PONG".into()));
    assert_eq!(
        in_left(api.clone()).await.0,
        Some(124),
        "the apiserver, partitioned"
    );
    assert_eq!(
        in_left(to_right.clone()).await.0,
        Some(124),
        "the other pod, partitioned"
    );
    let unknown = wait_node(&node_api, "node-a1", "Unknown").await;
    println!("partition node-a1: Ready=Unknown after {unknown:?}");
    kubelet.heal_node("node-a1").unwrap();
    assert_eq!(
        try_cmd(None, left, &["GET", "k"]).await,
        Ok("$1\r\nv".into())
    );
    assert_eq!(in_left(api).await.0, Some(0), "the apiserver, healed");
    wait_node(&node_api, "node-a1", "True").await;

    // Freeze node-b1: its processes stop (state T), a client times out; thawed, all is back.
    let pids = kubelet.pids(NS, "right");
    let client = redis::Client::open(format!("redis://{right}")).unwrap();
    let mut con = client.get_connection_with_timeout(SECOND).unwrap();
    con.set_read_timeout(Some(SECOND)).unwrap();
    kubelet.freeze_node("node-b1").unwrap();
    // SIGSTOP takes effect when each process next runs: under load, a moment after the kill.
    poll_until("the node's processes stopped", 5 * SECOND, POLL, || async {
        Ok(pids.iter().all(|p| process_state(*p) == 'T'))
    })
    .await
    .unwrap();
    let (err, mut con) = tokio::task::spawn_blocking(move || {
        let err = redis::cmd("PING").query::<String>(&mut con).unwrap_err();
        (err, con)
    })
    .await
    .unwrap();
    assert!(err.is_timeout(), "{err:?}");
    let unknown = wait_node(&node_api, "node-b1", "Unknown").await;
    println!("freeze node-b1: Ready=Unknown after {unknown:?}");
    kubelet.thaw_node("node-b1").unwrap();
    assert!(pids.iter().all(|p| process_state(*p) != 'T'));
    // The PING sent while frozen is answered now; then a new one.
    let late: String = redis::cmd("PING").query(&mut con).unwrap();
    assert_eq!(late, "PONG");
    assert_eq!(try_cmd(None, right, &["PING"]).await, Ok("+PONG".into()));
    wait_node(&node_api, "node-b1", "True").await;
    kubelet.wait_ready(NS, "right", 10 * SECOND).await.unwrap();
}

const SIDECAR_IMAGE: &str = "ghcr.io/valkey-sidecar/valkey-sidecar:dev";

/// A pod as a chart renders it with the agent as a native sidecar: a set-up init container the
/// harness cannot run (`busybox`), one it runs to completion (the agent's `--version`), the agent
/// (`restartPolicy: Always`) reading Valkey's password from a Secret volume, and Valkey taking the
/// same password from a `secretKeyRef`.
fn native_sidecar_pod(name: &str, node: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": { "name": name, "labels": { "app": "valkey" } },
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 10,
            "volumes": [
                { "name": "auth", "secret": { "secretName": "valkey-auth",
                    "items": [{ "key": "password", "path": "password", "mode": 0o400 }] } },
                { "name": "podinfo", "downwardAPI": { "items": [
                    { "path": "labels", "fieldRef": { "fieldPath": "metadata.labels" } } ] } },
                { "name": "data", "emptyDir": {} },
            ],
            "initContainers": [
                {
                    "name": "chown", "image": "busybox:1.37",
                    "command": ["sh", "-c", "chown -R 999 /data"],
                    "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                },
                { "name": "version", "image": SIDECAR_IMAGE,
                  "command": ["valkey-sidecar"], "args": ["--version"] },
                {
                    "name": "agent",
                    "image": SIDECAR_IMAGE,
                    "restartPolicy": "Always",
                    "env": [
                        { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                        { "name": "VALKEY_ADDR", "value": "localhost:6379" },
                        { "name": "VALKEY_PASSWORD_FILE", "value": "/etc/valkey-auth/password" },
                        { "name": "SIDECAR_MODE", "value": "replication" },
                        { "name": "SIDECAR_POLL_INTERVAL", "value": "100ms" },
                    ],
                    "volumeMounts": [
                        { "name": "auth", "mountPath": "/etc/valkey-auth", "readOnly": true },
                        { "name": "podinfo", "mountPath": "/etc/podinfo" },
                    ],
                    // The main container waits for this: the agent listens (not /startupz, which
                    // needs Valkey, which is not started before the agent is).
                    "startupProbe": { "tcpSocket": { "port": 9736 }, "initialDelaySeconds": 1,
                                      "periodSeconds": 1 },
                    "readinessProbe": { "httpGet": { "path": "/readyz", "port": 9736 },
                                        "periodSeconds": 1 },
                    // Runs at deletion, beside Valkey's; the agent's SIGTERM waits for Valkey.
                    "lifecycle": { "preStop": { "httpGet": { "path": "/livez", "port": 9736 } } },
                },
            ],
            "containers": [{
                "name": "valkey",
                "image": "valkey/valkey:9.1.2",
                "env": [{ "name": "VALKEY_PASSWORD",
                          "valueFrom": { "secretKeyRef": { "name": "valkey-auth", "key": "password" } } }],
                "args": ["--requirepass", "$(VALKEY_PASSWORD)"],
                "volumeMounts": [{ "name": "data", "mountPath": "/data" }],
                "lifecycle": { "preStop": { "sleep": { "seconds": 1 } } },
            }],
        },
    }))
    .unwrap()
}

fn init_status(pod: &Pod, container: &str) -> ContainerStatus {
    pod.status
        .as_ref()
        .and_then(|s| s.init_container_statuses.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == container).cloned())
        .unwrap_or_else(|| panic!("no init container status {container}: {:?}", pod.status))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_sidecar_volumes_and_ordered_termination() {
    let opts = ControlPlaneOptions {
        scheduler: false,
        ..ControlPlaneOptions::default()
    };
    let plane = ControlPlane::start(opts).await.unwrap();
    let nodes = FakeNodes::start(plane.client(), FakeNodesOptions::default())
        .await
        .unwrap();
    nodes.wait_ready(30 * SECOND).await.unwrap();
    let kubelet_opts = KubeletOptions {
        volume_refresh: Duration::from_millis(300),
        pods_cpu_shares: Some(512),
        ..KubeletOptions::default()
    };
    let kubelet = Kubelet::start(&plane, &nodes, kubelet_opts).await.unwrap();
    let secret: Secret = serde_json::from_value(json!({
        "metadata": { "name": "valkey-auth" }, "stringData": { "password": "s3cret-pw" },
    }))
    .unwrap();
    Api::<Secret>::namespaced(plane.client(), NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(plane.client(), NS);
    pods.create(
        &PostParams::default(),
        &native_sidecar_pod("native", "node-b1"),
    )
    .await
    .unwrap();
    let pod = kubelet.wait_ready(NS, "native", 30 * SECOND).await.unwrap();

    // Init order: `chown` skipped as completed, `version` ran to completion, then the agent, and
    // Valkey only once the agent's startup probe passed (1 s initial delay).
    let chown = init_status(&pod, "chown");
    let skipped = chown.state.unwrap().terminated.unwrap();
    assert_eq!(skipped.exit_code, 0);
    assert!(skipped.message.unwrap().contains("busybox"));
    let version = init_status(&pod, "version")
        .state
        .unwrap()
        .terminated
        .unwrap();
    assert_eq!(
        (version.exit_code, version.reason.as_deref()),
        (0, Some("Completed"))
    );
    let agent = init_status(&pod, "agent");
    assert!(agent.ready && agent.started == Some(true), "{agent:?}");
    assert_eq!(pod_condition(&pod, "Initialized"), Some(true));
    let started = |c: &str| {
        let starts = kubelet.starts();
        let at = starts
            .iter()
            .filter(|s| s.pod == "native" && s.container == c);
        at.map(|s| s.at).collect::<Vec<_>>()
    };
    assert!(started("chown").is_empty(), "busybox is not run");
    let (version_at, agent_at, valkey_at) = (
        started("version")[0],
        started("agent")[0],
        started("valkey")[0],
    );
    assert!(version_at < agent_at && agent_at < valkey_at);
    let waited = valkey_at - agent_at;
    assert!(
        waited >= SECOND,
        "Valkey started {waited:?} after the agent"
    );
    println!("init: agent started, Valkey {waited:?} later (the agent's startup probe)");

    // The Secret reached the agent as a file through its environment: Ready means it observed
    // Valkey, which refuses every command without the password.
    let ip = kubelet.pod_ip(NS, "native").unwrap();
    let (code, body) = http_get((ip, 9736).into(), "/status", SECOND)
        .await
        .unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"primary\""), "{body}");
    let auth = kubelet.volume_dir(NS, "native", "auth").unwrap();
    assert_eq!(
        std::fs::read_to_string(auth.join("password")).unwrap(),
        "s3cret-pw"
    );
    let podinfo = kubelet.volume_dir(NS, "native", "podinfo").unwrap();
    let labels = std::fs::read_to_string(podinfo.join("labels")).unwrap();
    assert!(labels.lines().any(|l| l == "app=\"valkey\""), "{labels}");
    // Volumes follow their sources: a new label reaches the downward-API file.
    let label = json!({ "metadata": { "labels": { "tier": "cache" } } });
    pods.patch("native", &PatchParams::default(), &Patch::Merge(label))
        .await
        .unwrap();
    poll_until(
        "label in the downward-API file",
        10 * SECOND,
        POLL,
        || async {
            let labels = std::fs::read_to_string(podinfo.join("labels"))?;
            Ok(labels.lines().any(|l| l == "tier=\"cache\""))
        },
    )
    .await
    .unwrap();
    // The ServiceAccount admission plugin's projected volume: token, CA and namespace.
    let volumes = pod.spec.as_ref().unwrap().volumes.as_ref().unwrap();
    let api_access = volumes
        .iter()
        .find(|v| v.name.starts_with("kube-api-access-"))
        .unwrap();
    let dir = kubelet.volume_dir(NS, "native", &api_access.name).unwrap();
    let token = std::fs::read_to_string(dir.join("token")).unwrap();
    assert_eq!(token.split('.').count(), 3, "a JWT");
    let ca = std::fs::read_to_string(dir.join("ca.crt")).unwrap();
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(std::fs::read_to_string(dir.join("namespace")).unwrap(), NS);
    // Mounted into every container (automount is on), so every container gets API credentials;
    // the chart's pods, which opt out, are checked in the agent's attack tests.
    for c in ["valkey", "agent"] {
        let (env, _) = kubelet.container_inputs(NS, "native", c).unwrap();
        let kubeconfig = env.iter().find(|(k, _)| k == "KUBECONFIG");
        assert!(kubeconfig.is_some(), "{c} has no API credentials: {env:?}");
    }

    // Every container runs in the pods' `cpu` cgroup (as in `kubepods`), with its weight.
    let valkey_pid = kubelet.container_pid(NS, "native", "valkey").unwrap();
    let agent_pid = kubelet.container_pid(NS, "native", "agent").unwrap();
    let procs = kubelet.kubepods().unwrap();
    let members = std::fs::read_to_string(&procs).unwrap();
    let members: Vec<u32> = members.lines().map(|l| l.parse().unwrap()).collect();
    assert!(
        members.contains(&valkey_pid) && members.contains(&agent_pid),
        "{valkey_pid} and {agent_pid} in {members:?}"
    );
    assert!(
        !members.contains(&std::process::id()),
        "the harness stays outside"
    );
    let shares = std::fs::read_to_string(procs.with_file_name("cpu.shares")).unwrap();
    assert_eq!(shares.trim(), "512");

    // A crashed native sidecar is restarted; the main container is left alone.
    kubelet.crash_container(NS, "native", "agent").unwrap();
    poll_until(
        "agent restarted and the pod Ready",
        20 * SECOND,
        POLL,
        || async {
            let pod = pods.get("native").await?;
            Ok(ready(&pod) && init_status(&pod, "agent").restart_count == 1)
        },
    )
    .await
    .unwrap();
    assert_eq!(started("agent").len(), 2);
    assert_eq!(
        kubelet.container_pid(NS, "native", "valkey"),
        Some(valkey_pid)
    );

    // Deletion: both preStop hooks start at once; Valkey gets SIGTERM after its own hook, the
    // agent only after Valkey has exited.
    let pids = kubelet.pids(NS, "native");
    pods.delete("native", &DeleteParams::default())
        .await
        .unwrap();
    poll_until("native removed", 20 * SECOND, POLL, || async {
        Ok(pods.get_opt("native").await?.is_none())
    })
    .await
    .unwrap();
    all_dead(&pids, "every process of the pod dead").await;
    let hooks = kubelet.hook_runs();
    let hook = |c: &str| {
        let found = hooks.iter().find(|h| h.pod == "native" && h.container == c);
        found.cloned().unwrap()
    };
    let (valkey_hook, agent_hook) = (hook("valkey"), hook("agent"));
    assert_eq!(
        agent_hook.result.as_deref(),
        Ok("HTTP 200"),
        "{agent_hook:?}"
    );
    let stops = kubelet.stops();
    let stop = |c: &str| {
        let found = stops.iter().find(|s| s.pod == "native" && s.container == c);
        found.cloned().unwrap()
    };
    let (valkey_stop, agent_stop) = (stop("valkey"), stop("agent"));
    assert!(valkey_stop.graceful && agent_stop.graceful, "{stops:?}");
    assert!(
        valkey_hook.at + valkey_hook.took <= valkey_stop.at,
        "hook, then SIGTERM"
    );
    assert!(
        agent_hook.at < valkey_stop.at,
        "the sidecar's hook runs at deletion"
    );
    let valkey_exit = valkey_stop.at + valkey_stop.took;
    assert!(
        valkey_exit <= agent_stop.at,
        "the sidecar's SIGTERM waits for Valkey"
    );
    println!(
        "termination: Valkey preStop {:?}, SIGTERM to exit {:?}; agent SIGTERM {:?} after Valkey exited",
        valkey_hook.took,
        valkey_stop.took,
        agent_stop.at - valkey_exit
    );
}
