//! Tasks that outlive their own bugs.
//!
//! The agent has no `unwrap`, but an index or an overflow can still panic, and a panic must not
//! take the whole agent down with it: the agent answers Valkey's own probes, so an agent that died
//! with every panic would crash-loop until Valkey's liveness probe restarted Valkey too — without
//! persistence, an empty primary. The release build unwinds (`panic = "unwind"`); a task's panic
//! is caught here, logged and counted (`valkey_sidecar_task_panics_total{kind}`), and a fresh task
//! is built after a back-off, with the state a restarted agent would have.

use std::any::Any;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::LocalBoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::runtime::metrics::Metrics;

/// The back-off between restarts of a panicking task.
#[derive(Debug, Clone, Copy)]
pub struct Restarts {
    /// Before the first restart; doubled (jittered, `retry::exponential`) after each panic.
    pub first: Duration,
    /// The longest wait; a task that ran longer than this before panicking starts over at `first`.
    pub max: Duration,
}

/// One second, doubling up to thirty.
pub const RESTARTS: Restarts = Restarts {
    first: Duration::from_secs(1),
    max: Duration::from_secs(30),
};

/// Runs the task `make` builds until one returns (at shutdown); a panicking one is replaced.
pub async fn supervised<F>(
    name: &'static str,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
    restarts: Restarts,
    make: F,
) where
    F: Fn() -> LocalBoxFuture<'static, ()>,
{
    metrics.task_supervised(name);
    let schedule = || crate::runtime::retry::exponential(restarts.first, restarts.max);
    let mut delays = schedule();
    loop {
        let started = Instant::now();
        let Err(panic) = AssertUnwindSafe(make()).catch_unwind().await else {
            return;
        };
        if started.elapsed() > restarts.max {
            delays = schedule();
        }
        let delay = delays.next().unwrap_or(restarts.max);
        let message = message(panic.as_ref());
        tracing::error!(
            task = name,
            panic = message,
            ?delay,
            "task panicked: starting it afresh"
        );
        metrics.task_panic(name);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}

fn message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("(no message)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[tokio::test]
    async fn a_panicking_task_is_started_afresh_and_counted() {
        let metrics = Arc::new(Metrics::new());
        let (_stop, shutdown) = watch::channel(false);
        let runs = Rc::new(Cell::new(0));
        let quick = Restarts {
            first: Duration::from_millis(5),
            max: Duration::from_millis(20),
        };
        let counted = runs.clone();
        supervised("test", metrics.clone(), shutdown, quick, move || {
            let run = counted.get();
            counted.set(run + 1);
            async move {
                if run < 2 {
                    panic!("bug number {run}");
                }
            }
            .boxed_local()
        })
        .await;
        assert_eq!(runs.get(), 3, "two panics, then a run that returned");
        let text = metrics.encode();
        assert!(
            text.contains("valkey_sidecar_task_panics_total{kind=\"test\"} 2"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_task_that_never_panicked_exports_zero_panics() {
        let metrics = Arc::new(Metrics::new());
        let (_stop, shutdown) = watch::channel(false);
        supervised("calm", metrics.clone(), shutdown, RESTARTS, || {
            async {}.boxed_local()
        })
        .await;
        let text = metrics.encode();
        assert!(
            text.contains("valkey_sidecar_task_panics_total{kind=\"calm\"} 0"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn shutdown_ends_the_wait_for_a_restart() {
        let metrics = Arc::new(Metrics::new());
        let (stop, shutdown) = watch::channel(false);
        let slow = Restarts {
            first: Duration::from_secs(3600),
            max: Duration::from_secs(3600),
        };
        let _ = stop.send(true);
        let run = supervised("test", metrics, shutdown, slow, || {
            async { panic!("always") }.boxed_local()
        });
        let ended = tokio::time::timeout(Duration::from_secs(5), run).await;
        assert!(
            ended.is_ok(),
            "still waiting an hour to restart after shutdown"
        );
    }
}
