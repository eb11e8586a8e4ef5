//! Structured logs: JSON when stderr is not a terminal (a pod's log), text for humans.

use std::io::IsTerminal;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::cli::config::LogFormat;

/// Installs the global subscriber; `RUST_LOG` filters (default `info`).
///
/// The filter is `Targets` (`level` or `target=level`, comma-separated), not `EnvFilter`: the
/// latter's regex-based directive parser alone kept ≈0.45 MiB more of the binary resident at idle
/// (docs/benchmarks.md), and span or field filters are not needed to debug one agent.
pub fn init(format: LogFormat) {
    let (filter, ignored) = filter(std::env::var("RUST_LOG").ok().as_deref());
    let json = match format {
        LogFormat::Json => true,
        LogFormat::Text => false,
        LogFormat::Auto => !std::io::stderr().is_terminal(),
    };
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(filter);
    if json {
        let fmt = fmt.json().flatten_event(true).with_current_span(false);
        registry.with(fmt).init();
    } else {
        registry.with(fmt).init();
    }
    if let Some(bad) = ignored {
        tracing::warn!(
            rust_log = bad,
            "RUST_LOG is not `level` or `target=level,...`: logging at info"
        );
    }
}

/// The filter `RUST_LOG` asks for, or `info` and the value that could not be read. An empty value
/// counts as unset (an empty `Targets` would silence every log).
fn filter(rust_log: Option<&str>) -> (Targets, Option<String>) {
    let info = || Targets::new().with_default(tracing::Level::INFO);
    let rust_log = rust_log.map(str::trim).filter(|v| !v.is_empty());
    match rust_log.map(str::parse::<Targets>) {
        None => (info(), None),
        Some(Ok(t)) => (t, None),
        Some(Err(_)) => (info(), rust_log.map(str::to_owned)),
    }
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    use super::filter;

    #[test]
    fn rust_log_sets_levels_per_target_and_a_bad_value_falls_back_to_info() {
        let (t, bad) = filter(Some("warn,valkey_sidecar::coordinator=debug"));
        assert!(bad.is_none());
        assert!(t.would_enable("valkey_sidecar::coordinator::round", &Level::DEBUG));
        assert!(!t.would_enable("kube_client", &Level::INFO));
        let (t, bad) = filter(Some("valkey_sidecar=[{x=1}]"));
        assert_eq!(bad.as_deref(), Some("valkey_sidecar=[{x=1}]"));
        assert!(t.would_enable("kube_client", &Level::INFO));
        assert!(!t.would_enable("kube_client", &Level::DEBUG));
        for unset in [None, Some(""), Some(" ")] {
            let (t, bad) = filter(unset);
            assert!(
                bad.is_none() && t.would_enable("x", &Level::INFO),
                "{unset:?}"
            );
        }
    }
}
