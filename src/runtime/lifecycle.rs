//! Signals: the first SIGTERM or SIGINT starts a graceful stop, a second one aborts at once.

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::watch;

/// Returns a receiver that turns `true` at the first signal. A second signal exits the process.
pub fn shutdown_on_signals() -> std::io::Result<watch::Receiver<bool>> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::info!("shutting down (a second signal aborts)");
        let _ = tx.send(true);
        tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} }
        tracing::warn!("second signal: aborting");
        std::process::exit(crate::cli::exit::ABORTED);
    });
    Ok(rx)
}
