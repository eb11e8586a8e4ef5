//! Request routing: a path to a verdict or a document.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::CONTENT_TYPE;
use hyper::{Method, Request, Response, StatusCode};
use tokio::sync::watch;
use valkey_sidecar_core::health::{Bounds, HealthState, StopWait, Verdict};
use valkey_sidecar_core::labels::advertised;
use valkey_sidecar_core::observation::{Mode, Role};
use valkey_sidecar_core::restart::{self, Permit};

use super::status;
use crate::cli::config::Identity;
use crate::runtime::clock::Clock;
use crate::runtime::metrics::Metrics;

/// What the handlers read.
pub struct App {
    pub state: watch::Receiver<HealthState>,
    pub clock: Clock,
    pub bounds: Bounds,
    pub mode: Mode,
    pub identity: Identity,
    pub metrics: Arc<Metrics>,
    /// Replication mode: whether the shard record lets this Valkey be primary now (see
    /// `keeper::Keeper`); `/primary` answers 200 only with it, like Patroni's.
    pub claim: Option<watch::Receiver<bool>>,
    /// Cluster mode: whether a start of the local Valkey may go ahead (`start_guard`), for
    /// `/valkey-start` and `/livez`.
    pub start: Option<watch::Receiver<Permit>>,
    /// Features that are off, and why (`/status`).
    pub off: watch::Receiver<Vec<crate::cli::features::Off>>,
}

type Body = Full<Bytes>;

impl App {
    /// Answers one request; only `/prestop` waits (for the hand-over), everything else is immediate.
    pub async fn respond<B>(&self, req: Request<B>) -> Response<Body> {
        if req.uri().path() == "/prestop" && req.method() == Method::GET {
            let resp = match duration_param(req.uri().query(), "timeout", DEFAULT_PRESTOP_WAIT) {
                Ok(limit) => verdict(self.prestop(limit).await),
                Err(msg) => text(StatusCode::BAD_REQUEST, msg),
            };
            self.metrics.http("/prestop", resp.status().as_u16());
            return resp;
        }
        self.handle(&req)
    }

    /// `/prestop`: blocks until the local Valkey is no longer primary (the coordinator has handed
    /// it over) or `limit` passes, and that has held for `STOP_SETTLE_MS` (`core::health::StopWait`).
    /// Read-only: it never triggers anything itself.
    async fn prestop(&self, limit: Duration) -> Verdict {
        let mut state = self.state.clone();
        let deadline = tokio::time::Instant::now() + limit;
        let mut wait = StopWait::default();
        loop {
            let now = self.clock.now();
            let verdict = state.borrow_and_update().stop(now, &self.bounds);
            let wake = match wait.step(verdict.clone(), now) {
                Ok(settled) => return settled,
                Err(wake) => wake,
            };
            let until = wake.map_or(deadline, |at| {
                let d = Duration::from_millis(at.since(now));
                deadline.min(tokio::time::Instant::now() + d)
            });
            let changed = tokio::time::timeout_at(until, state.changed()).await;
            if matches!(changed, Ok(Err(_))) || tokio::time::Instant::now() >= deadline {
                return verdict.unwrap_or_else(|| Verdict {
                    ok: false,
                    reason: format!("still primary after {limit:?}"),
                });
            }
        }
    }

    /// Answers one request that needs no waiting.
    pub fn handle<B>(&self, req: &Request<B>) -> Response<Body> {
        let path = known_path(req.uri().path());
        let resp = if req.method() != Method::GET && req.method() != Method::HEAD {
            text(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD\n".into())
        } else {
            self.route(path, req.uri().query())
        };
        self.metrics.http(path, resp.status().as_u16());
        resp
    }

    fn route(&self, path: &'static str, query: Option<&str>) -> Response<Body> {
        let state = self.state.borrow();
        let now = self.clock.now();
        let b = &self.bounds;
        match path {
            "/livez" => verdict(self.held(state.liveness(now, b), state.down)),
            "/readyz" => verdict(state.readiness(now, b, self.mode, self.claim())),
            "/startupz" => verdict(state.startup()),
            "/primary" => verdict(claimed(state.primary(now, b), self.claim.as_ref())),
            "/replica" => match lag_param(query) {
                Ok(lag) => verdict(state.replica(now, b, lag)),
                Err(msg) => text(StatusCode::BAD_REQUEST, msg),
            },
            "/status" => json(status::render(&state, self, now)),
            "/metrics" => metrics(self.metrics.encode()),
            "/valkey-start" => verdict(self.start_verdict()),
            _ => text(StatusCode::NOT_FOUND, "not found\n".into()),
        }
    }
}

/// Maps a request path onto the fixed set used as a metric label.
fn known_path(path: &str) -> &'static str {
    const PATHS: [&str; 8] = [
        "/livez",
        "/readyz",
        "/startupz",
        "/primary",
        "/replica",
        "/status",
        "/metrics",
        "/valkey-start",
    ];
    PATHS.into_iter().find(|p| *p == path).unwrap_or("other")
}

impl App {
    /// Replication mode with a coordinator: whether the keeper may advertise its Valkey as primary.
    pub(super) fn claim(&self) -> Option<bool> {
        self.claim.as_ref().map(|rx| *rx.borrow())
    }

    /// `/valkey-start`: `valkey-sidecar await`'s question. Without a guard (replication mode) it
    /// is always "go": there the shard record keeps a restarted primary from being trusted.
    fn start_verdict(&self) -> Verdict {
        let Some(start) = &self.start else {
            return Verdict {
                ok: true,
                reason: "go: nothing to wait for in this mode".into(),
            };
        };
        let permit = start.borrow();
        let word = if permit.go() { "go" } else { "hold" };
        Verdict {
            ok: permit.go(),
            reason: format!("{word}: {}", permit.reason()),
        }
    }

    fn held(&self, liveness: Verdict, down: bool) -> Verdict {
        match &self.start {
            Some(start) => restart::liveness(liveness, down, &start.borrow()),
            None => liveness,
        }
    }
}

/// A primary verdict stands only where the role may be advertised (`core::labels::advertised`).
fn claimed(v: Verdict, claim: Option<&watch::Receiver<bool>>) -> Verdict {
    let claim = claim.map(|rx| *rx.borrow());
    match v.ok && advertised(Role::Primary, claim) != Role::Primary {
        true => Verdict {
            ok: false,
            reason: "primary, but not on record: fenced or superseded".into(),
        },
        false => v,
    }
}

/// How long `/prestop` waits by default: under the default 30 s termination grace period.
const DEFAULT_PRESTOP_WAIT: Duration = Duration::from_secs(25);
/// The longest `/prestop` wait a caller may ask for: any pod can reach the probe port, and each
/// wait holds a connection; a real hand-over takes seconds and a grace period minutes.
pub(super) const MAX_PRESTOP_WAIT: Duration = Duration::from_secs(300);

fn duration_param(query: Option<&str>, name: &str, default: Duration) -> Result<Duration, String> {
    let prefix = format!("{name}=");
    let Some(v) = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix(prefix.as_str()))
    else {
        return Ok(default);
    };
    let max = crate::runtime::clock::millis(MAX_PRESTOP_WAIT);
    crate::cli::config::parse_duration_in(v, 0, max).map_err(|e| format!("{name}: {e}\n"))
}

fn lag_param(query: Option<&str>) -> Result<Option<u64>, String> {
    let Some(v) = query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .find_map(|kv| kv.strip_prefix("lag="))
    else {
        return Ok(None);
    };
    v.parse()
        .map(Some)
        .map_err(|_| format!("lag must be a number of bytes, got {v:?}\n"))
}

fn verdict(v: Verdict) -> Response<Body> {
    let code = if v.ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    text(code, format!("{}\n", v.reason))
}

fn text(code: StatusCode, body: String) -> Response<Body> {
    respond(code, "text/plain; charset=utf-8", body)
}

fn json(body: String) -> Response<Body> {
    respond(StatusCode::OK, "application/json", body)
}

fn metrics(body: String) -> Response<Body> {
    respond(
        StatusCode::OK,
        "application/openmetrics-text; version=1.0.0; charset=utf-8",
        body,
    )
}

fn respond(code: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    *resp.status_mut() = code;
    resp.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    resp
}

#[cfg(test)]
mod tests {

    #[test]
    fn primary_needs_the_claim_when_there_is_one() {
        let ok = Verdict {
            ok: true,
            reason: "primary".into(),
        };
        let (tx, rx) = watch::channel(false);
        assert!(!claimed(ok.clone(), Some(&rx)).ok);
        assert!(claimed(ok.clone(), None).ok);
        tx.send_replace(true);
        assert!(claimed(ok, Some(&rx)).ok);
    }

    use super::*;

    #[test]
    fn lag_parameter() {
        assert_eq!(lag_param(None), Ok(None));
        assert_eq!(lag_param(Some("lag=100")), Ok(Some(100)));
        assert_eq!(lag_param(Some("x=1&lag=5")), Ok(Some(5)));
        assert!(lag_param(Some("lag=-1")).is_err());
    }

    #[test]
    fn duration_parameter() {
        let d = Duration::from_secs(25);
        assert_eq!(duration_param(None, "timeout", d), Ok(d));
        assert_eq!(
            duration_param(Some("timeout=3s"), "timeout", d),
            Ok(Duration::from_secs(3))
        );
        assert!(duration_param(Some("timeout=3"), "timeout", d).is_err());
        assert!(duration_param(Some("timeout=300s"), "timeout", d).is_ok());
        assert!(duration_param(Some("timeout=301s"), "timeout", d).is_err());
    }

    #[test]
    fn unknown_paths_share_one_label() {
        assert_eq!(known_path("/readyz"), "/readyz");
        assert_eq!(known_path("/secret/../x"), "other");
    }
}
