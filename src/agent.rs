//! Wiring: builds the pieces from the configuration and runs them until shutdown.

use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::watch;
use valkey_sidecar_core::health::HealthState;
use valkey_sidecar_core::placement::Placement;

use crate::clock::Clock;
use crate::config::Config;
use crate::http::{self, App};
use crate::kube::labeler::Labeler;
use crate::metrics::Metrics;
use crate::observer::Observer;
use crate::valkey::{Connector, Session, tls};

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
    Kube(#[from] crate::kube::KubeError),
}

impl StartError {
    /// Exit code: 64 for configuration the user must fix, 69 (`EX_UNAVAILABLE`) otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            StartError::Tls(_) | StartError::Kube(_) => crate::config::EXIT_CONFIG,
            _ => 69,
        }
    }
}

/// Runs the agent until SIGTERM/SIGINT.
pub async fn run(config: Config) -> Result<(), StartError> {
    let shutdown = crate::lifecycle::shutdown_on_signals().map_err(StartError::Signals)?;
    let clock = Clock::start();
    let metrics = Arc::new(Metrics::new());
    let (state_tx, state_rx) = watch::channel(HealthState::new(clock.now()));
    let configured = Placement {
        zone: config.identity.zone.clone(),
        region: config.identity.region.clone(),
    };
    let (placement_tx, placement_rx) = watch::channel(configured);
    let labeler = labeler(&config, clock, &state_rx, placement_tx, &metrics).await?;
    let probe = listen(config.probe_addr).await?;
    let admin = listen(config.admin_addr).await?;
    let observer = Observer {
        session: Session::new(connector(&config)?),
        mode: config.mode,
        interval: config.poll_interval,
        bounds: config.bounds,
        clock,
        state: state_tx,
        metrics: metrics.clone(),
        placement: placement_rx,
    };
    let app = Arc::new(App {
        state: state_rx,
        clock,
        bounds: config.bounds,
        mode: config.mode,
        identity: config.identity.clone(),
        metrics,
    });
    tracing::info!(probe = %config.probe_addr, admin = %config.admin_addr, valkey = %format!("{}:{}", config.valkey.host, config.valkey.port), mode = ?config.mode, "valkey-sidecar started");
    let labels_shutdown = shutdown.clone();
    let labels = async move {
        if let Some(labeler) = labeler {
            labeler.run(labels_shutdown).await;
        }
    };
    tokio::join!(
        observer.run(shutdown.clone()),
        labels,
        http::serve(probe, app.clone(), shutdown.clone()),
        http::serve(admin, app, shutdown),
    );
    tracing::info!("stopped");
    Ok(())
}

/// The pod labeler, when the agent keeps labels (SIDECAR_LABELS).
async fn labeler(
    config: &Config,
    clock: Clock,
    state: &watch::Receiver<HealthState>,
    placement: watch::Sender<Placement>,
    metrics: &Arc<Metrics>,
) -> Result<Option<Labeler>, StartError> {
    let Some(kube) = config.kube.clone() else {
        return Ok(None);
    };
    Ok(Some(Labeler {
        client: crate::kube::client().await?,
        config: kube,
        identity: config.identity.clone(),
        mode: config.mode,
        bounds: config.bounds,
        clock,
        state: state.clone(),
        placement,
        metrics: metrics.clone(),
    }))
}

fn connector(config: &Config) -> Result<Connector, StartError> {
    let v = &config.valkey;
    Ok(Connector {
        host: v.host.clone(),
        port: v.port,
        username: v.username.clone(),
        password_file: v.password_file.clone(),
        tls: v.tls.as_ref().map(tls::build).transpose()?,
        timeout: v.timeout,
    })
}

async fn listen(addr: std::net::SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Listen { addr, source })
}
