//! `bench planner`'s probe rows (issue 33): whether the coordinator's heaviest rules stall the
//! probes. The agent answers probes and runs its coordinator rounds on one single-threaded
//! runtime, so a round's pure work is time during which no probe is answered. Here the agent's
//! own HTTP server (`valkey_sidecar::http::serve`, as `agent.rs` starts it) shares such a runtime
//! with `formation::decide` and `plan::decide` over 1,000 shards × 3 run back to back — worse than
//! a real coordinator, whose rounds wait on Valkey and the API between the two and pause between
//! rounds — while a client probes `/livez` over a new connection each time, as the kubelet does.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::sync::watch;
use valkey_sidecar::cli::config::Identity;
use valkey_sidecar::http::{App, serve};
use valkey_sidecar::runtime::clock::Clock;
use valkey_sidecar::runtime::metrics::Metrics;
use valkey_sidecar_core::formation::FormationView;
use valkey_sidecar_core::health::{Bounds, HealthState};
use valkey_sidecar_core::observation::Mode;
use valkey_sidecar_core::plan::{Policy, World};

use crate::report::percentile;

/// Probes per phase, one every [`GAP`].
const PROBES: usize = 2000;
const GAP: Duration = Duration::from_millis(5);
/// The kubelet's default probe timeout: a probe slower than this fails.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The rules a round runs, over one world.
struct Round {
    world: World,
    policy: Policy,
    formation: FormationView,
}

/// One phase's probe latencies and how many rounds ran meanwhile.
struct Phase {
    samples: Vec<Duration>,
    rounds: u64,
}

/// Probes an idle agent, then one whose runtime runs `round` back to back; prints both rows.
pub fn run(shards: usize, world: World, policy: Policy, formation: FormationView) -> Result<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let (busy, busy_rx) = watch::channel(false);
    let (stop, stop_rx) = watch::channel(false);
    let (count, count_rx) = watch::channel(0u64);
    let round = Round {
        world,
        policy,
        formation,
    };
    let agent = std::thread::spawn(move || agent(listener, round, busy_rx, stop_rx, count));
    let idle = probe(addr, &count_rx)?;
    busy.send(true)?;
    let loaded = probe(addr, &count_rx)?;
    stop.send(true)?;
    agent
        .join()
        .map_err(|_| anyhow::anyhow!("the agent thread panicked"))??;
    print(shards, &idle, &loaded);
    Ok(())
}

/// The agent's side: its HTTP server and, once `busy`, rounds back to back, on one thread.
fn agent(
    listener: TcpListener,
    round: Round,
    busy: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
    count: watch::Sender<u64>,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let server = serve(listener, Arc::new(app()), stop.clone());
        tokio::join!(server, rounds(&round, busy, stop, count));
        Ok(())
    })
}

/// An agent's App with a default health state: `/livez` answers from it like any probe.
fn app() -> App {
    let (_, state) = watch::channel(HealthState::default());
    let (_, off) = watch::channel(Vec::new());
    App {
        state,
        clock: Clock::start(),
        bounds: Bounds {
            liveness_window_ms: 30_000,
            stale_after_ms: 5_000,
            max_lag_bytes: 1 << 20,
        },
        mode: Mode::Cluster,
        identity: Identity::default(),
        metrics: Arc::new(Metrics::new()),
        claim: None,
        start: None,
        off,
    }
}

/// Once `busy`: formation and the planner, back to back, yielding between them as a round's
/// awaits do, until `stop`.
async fn rounds(
    round: &Round,
    mut busy: watch::Receiver<bool>,
    stop: watch::Receiver<bool>,
    count: watch::Sender<u64>,
) {
    if busy.wait_for(|b| *b).await.is_err() {
        return;
    }
    while !*stop.borrow() {
        drop(std::hint::black_box(
            valkey_sidecar_core::formation::decide(&round.formation),
        ));
        tokio::task::yield_now().await;
        drop(std::hint::black_box(valkey_sidecar_core::plan::decide(
            &round.world,
            &round.policy,
        )));
        tokio::task::yield_now().await;
        count.send_modify(|n| *n += 1);
    }
}

/// [`PROBES`] probes of `/livez`, each on a new connection; a failed or late probe is an error.
fn probe(addr: SocketAddr, count: &watch::Receiver<u64>) -> Result<Phase> {
    let before = *count.borrow();
    let mut samples = Vec::with_capacity(PROBES);
    for _ in 0..PROBES {
        let t = Instant::now();
        let status = livez(addr).context("probing /livez")?;
        let took = t.elapsed();
        if !status.starts_with("HTTP/1.1 ") || took > PROBE_TIMEOUT {
            bail!("probe answered {status:?} after {took:?}");
        }
        samples.push(took);
        std::thread::sleep(GAP);
    }
    samples.sort();
    Ok(Phase {
        samples,
        rounds: *count.borrow() - before,
    })
}

/// One `GET /livez`; its status line.
fn livez(addr: SocketAddr) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
    s.set_read_timeout(Some(PROBE_TIMEOUT))?;
    s.write_all(b"GET /livez HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    Ok(reply.lines().next().unwrap_or_default().to_owned())
}

fn print(shards: usize, idle: &Phase, loaded: &Phase) {
    println!(
        "#### Probes while the coordinator's rules run ({shards} shards × 3)\n\nCommand: `target/release/bench planner`. The agent's own HTTP server on a single-threaded runtime, as in the agent; a client probes `/livez` every {} ms over a new connection ({PROBES} probes per row). Loaded: the same runtime runs `formation::decide` and `plan::decide` over {shards} shards × 3 back to back, yielding only between them — a real coordinator waits on Valkey and the API between them and rests between rounds, so this bounds what its rounds cost the probes (and the crash watch, which runs on the same runtime).\n",
        GAP.as_millis()
    );
    println!("| agent runtime | rounds | probe p50 | p99 | max |");
    println!("|---|---|---|---|---|");
    for (name, p) in [("idle", idle), ("rounds back to back", loaded)] {
        let q = |f| percentile(&p.samples, f).as_secs_f64() * 1e3;
        println!(
            "| {name} | {} | {:.2} ms | {:.2} ms | {:.2} ms |",
            p.rounds,
            q(0.5),
            q(0.99),
            q(1.0)
        );
    }
    println!();
}
