//! API requests counted from kube-apiserver's audit log, per client.
//!
//! `apiserver_request_total` has no label for the client, and every agent uses the same
//! ServiceAccount, so the apiserver's metrics cannot say which agent called. Its audit log can:
//! a pod's token is bound to the pod (TokenRequest with a `boundObjectRef`, as the kubelet mints
//! it), and the apiserver records the pod in `user.extra["authentication.kubernetes.io/pod-name"]`
//! of every request made with it. Other clients are identified by user name.
//!
//! Each request is counted once, at the time the apiserver received it: events are deduplicated
//! by `auditID` (a watch has a `ResponseStarted` and, when it ends, a `ResponseComplete` event),
//! and a window keeps requests received inside it — so a watch opened before the window and closed
//! inside it does not count.
//!
//! ```no_run
//! # use std::time::{Duration, SystemTime};
//! # use anyhow::Context;
//! # use valkey_sidecar_testkit::k8s::{ControlPlane, ControlPlaneOptions};
//! # use valkey_sidecar_testkit::k8s::audit::{pod_identity, Usage};
//! # async fn demo() -> anyhow::Result<()> {
//! let plane = ControlPlane::start(ControlPlaneOptions::default().audit()).await?;
//! let from = SystemTime::now();
//! tokio::time::sleep(Duration::from_secs(30)).await;
//! let log = plane.audit_log().context("auditing is on")?;
//! let usage: Usage = log.usage(from, SystemTime::now())?;
//! println!("{} writes", usage.writes(&pod_identity("valkey", "valkey-0-0")));
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::Value;

use crate::Result;

/// Verbs that change state.
pub const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// Verbs in the order tables show them (their "all" column counts any other verb too).
pub const VERBS: [&str; 7] = [
    "get", "list", "watch", "create", "update", "patch", "delete",
];

const POD_NAME_EXTRA: &str = "authentication.kubernetes.io/pod-name";

/// One request as the audit log records it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub audit_id: String,
    /// `<namespace>/<pod>` for a pod-bound ServiceAccount token ([`pod_identity`]), else the
    /// user name.
    pub who: String,
    pub user_agent: String,
    pub verb: String,
    /// `pods`, `pods/status`, `leases`, …; the path for non-resource requests (`/readyz`).
    pub resource: String,
    pub name: Option<String>,
    /// The response code, when the event has one.
    pub code: Option<u16>,
    /// When the apiserver received the request, in microseconds since the Unix epoch.
    pub received_us: i64,
}

/// The identity [`Request::who`] gives a pod's own token.
pub fn pod_identity(namespace: &str, pod: &str) -> String {
    format!("{namespace}/{pod}")
}

/// One line of the log; `None` when it is no audit event this module understands.
pub fn parse_line(line: &str) -> Option<Request> {
    let v: Value = serde_json::from_str(line).ok()?;
    let text = |v: &Value| v.as_str().map(str::to_owned);
    let object = v.get("objectRef");
    let resource = match object.and_then(|o| o.get("resource")).and_then(text) {
        Some(r) => match object.and_then(|o| o.get("subresource")).and_then(text) {
            Some(sub) => format!("{r}/{sub}"),
            None => r,
        },
        None => path_of(v.get("requestURI").and_then(Value::as_str).unwrap_or("")),
    };
    Some(Request {
        audit_id: text(v.get("auditID")?)?,
        who: identity(v.get("user")?)?,
        user_agent: v.get("userAgent").and_then(text).unwrap_or_default(),
        verb: text(v.get("verb")?)?,
        resource,
        name: object.and_then(|o| o.get("name")).and_then(text),
        code: v
            .pointer("/responseStatus/code")
            .and_then(Value::as_u64)
            .and_then(|c| u16::try_from(c).ok()),
        received_us: parse_timestamp_us(v.get("requestReceivedTimestamp")?.as_str()?)?,
    })
}

/// `<namespace>/<pod>` when the token is bound to a pod, else the user name.
fn identity(user: &Value) -> Option<String> {
    let name = user.get("username")?.as_str()?;
    let pod = user
        .pointer(&format!("/extra/{}", POD_NAME_EXTRA.replace('/', "~1")))
        .and_then(|v| v.get(0))
        .and_then(Value::as_str);
    // system:serviceaccount:<namespace>:<account>
    let namespace = name
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split(':').next());
    Some(match (namespace, pod) {
        (Some(ns), Some(pod)) => pod_identity(ns, pod),
        _ => name.to_owned(),
    })
}

fn path_of(uri: &str) -> String {
    uri.split('?').next().unwrap_or(uri).to_owned()
}

/// RFC 3339 in UTC (`2026-11-29T23:41:58.123456Z`, as the apiserver writes `MicroTime`) to
/// microseconds since the Unix epoch.
pub fn parse_timestamp_us(s: &str) -> Option<i64> {
    let (date, time) = s.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.splitn(3, '-').map(str::parse::<i64>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(str::parse::<i64>);
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    // The first six digits are microseconds; pad "123" to "123000".
    let digits: String = frac.chars().chain(std::iter::repeat('0')).take(6).collect();
    let micros = if frac.is_empty() {
        0
    } else {
        digits.parse::<i64>().ok()?
    };
    let seconds = days_from_civil(y, m, day) * 86_400 + hh * 3_600 + mm * 60 + ss;
    Some(seconds * 1_000_000 + micros)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn micros_of(t: SystemTime) -> i64 {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

/// The apiserver's audit log file.
#[derive(Clone, Debug)]
pub struct AuditLog {
    path: PathBuf,
}

impl AuditLog {
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every request received in `[from, to)`, each once, in log order.
    pub fn requests(&self, from: SystemTime, to: SystemTime) -> Result<Vec<Request>> {
        let text = std::fs::read_to_string(&self.path)
            .with_context(|| format!("reading {}", self.path.display()))?;
        let (from, to) = (micros_of(from), micros_of(to));
        let mut seen = BTreeSet::new();
        Ok(text
            .lines()
            .filter_map(parse_line)
            .filter(|r| r.received_us >= from && r.received_us < to)
            .filter(|r| seen.insert(r.audit_id.clone()))
            .collect())
    }

    /// The requests received in `[from, to)`, counted.
    pub fn usage(&self, from: SystemTime, to: SystemTime) -> Result<Usage> {
        let window = to.duration_since(from).unwrap_or_default();
        Ok(Usage::count(&self.requests(from, to)?, window))
    }
}

/// `(verb, resource)` → requests.
pub type Counts = BTreeMap<(String, String), u64>;

/// Requests counted per client, verb and resource over a window.
#[derive(Clone, Debug, Default)]
pub struct Usage {
    pub window: Duration,
    /// Client ([`Request::who`]) → counts.
    pub by_client: BTreeMap<String, Counts>,
}

impl Usage {
    pub fn count(requests: &[Request], window: Duration) -> Usage {
        let mut by_client: BTreeMap<String, Counts> = BTreeMap::new();
        for r in requests {
            let counts = by_client.entry(r.who.clone()).or_default();
            *counts
                .entry((r.verb.clone(), r.resource.clone()))
                .or_default() += 1;
        }
        Usage { window, by_client }
    }

    /// Requests of `who` with `verb` on `resource`.
    pub fn get(&self, who: &str, verb: &str, resource: &str) -> u64 {
        self.by_client
            .get(who)
            .and_then(|c| c.get(&(verb.to_owned(), resource.to_owned())))
            .copied()
            .unwrap_or(0)
    }

    /// Requests of `who` with `verb`, any resource.
    pub fn verb(&self, who: &str, verb: &str) -> u64 {
        self.by_client.get(who).map_or(0, |c| {
            c.iter()
                .filter(|((v, _), _)| v == verb)
                .map(|(_, n)| n)
                .sum()
        })
    }

    /// Every request of `who`.
    pub fn total(&self, who: &str) -> u64 {
        self.by_client.get(who).map_or(0, |c| c.values().sum())
    }

    /// Requests of `who` that change state ([`WRITE_VERBS`]).
    pub fn writes(&self, who: &str) -> u64 {
        WRITE_VERBS.iter().map(|v| self.verb(who, v)).sum()
    }

    /// `n` requests over the window, per minute.
    pub fn per_minute(&self, n: u64) -> f64 {
        let secs = self.window.as_secs_f64();
        if secs == 0.0 {
            return 0.0;
        }
        n as f64 * 60.0 / secs
    }

    /// Markdown: one row per client of `clients` (label, identity), a column per verb, in
    /// requests per minute.
    pub fn verb_table(&self, clients: &[(String, String)]) -> String {
        let mut out = String::from("| agent | ");
        out.push_str(&VERBS.join(" | "));
        out.push_str(" | all | of which writes |\n|---|");
        out.push_str(&"---|".repeat(VERBS.len() + 2));
        out.push('\n');
        for (label, who) in clients {
            let cells: Vec<String> = VERBS.iter().map(|v| self.rate(self.verb(who, v))).collect();
            out.push_str(&format!(
                "| {label} | {} | {} | {} |\n",
                cells.join(" | "),
                self.rate(self.total(who)),
                self.rate(self.writes(who))
            ));
        }
        out
    }

    /// Markdown: one row per client of `clients`, verb and resource, with the count and the rate.
    pub fn detail_table(&self, clients: &[(String, String)]) -> String {
        let mut out = String::from(
            "| agent | verb | resource | requests | per minute |\n|---|---|---|---|---|\n",
        );
        for (label, who) in clients {
            let Some(counts) = self.by_client.get(who) else {
                out.push_str(&format!("| {label} | — | — | 0 | 0 |\n"));
                continue;
            };
            for ((verb, resource), n) in counts {
                out.push_str(&format!(
                    "| {label} | {verb} | {resource} | {n} | {} |\n",
                    self.rate(*n)
                ));
            }
        }
        out
    }

    fn rate(&self, n: u64) -> String {
        format!("{:.1}", self.per_minute(n))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A `ResponseComplete` event as kube-apiserver 1.37 writes it for a pod-bound token.
    const LEASE_UPDATE: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a1","stage":"ResponseComplete","requestURI":"/apis/coordination.k8s.io/v1/namespaces/valkey/leases/valkey-coordinator","verb":"update","user":{"username":"system:serviceaccount:valkey:valkey-sidecar","uid":"u","groups":["system:serviceaccounts"],"extra":{"authentication.kubernetes.io/credential-id":["JTI=x"],"authentication.kubernetes.io/pod-name":["valkey-1-0"],"authentication.kubernetes.io/pod-uid":["p"]}},"sourceIPs":["127.0.0.1"],"userAgent":"valkey-sidecar/0.1.0","objectRef":{"resource":"leases","namespace":"valkey","name":"valkey-coordinator","apiGroup":"coordination.k8s.io","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-11-29T23:41:58.123456Z","stageTimestamp":"2026-11-29T23:41:58.130000Z"}"#;

    #[test]
    fn a_pod_bound_token_is_identified_by_its_pod() {
        let r = parse_line(LEASE_UPDATE).unwrap();
        assert_eq!(r.who, "valkey/valkey-1-0");
        assert_eq!(r.verb, "update");
        assert_eq!(r.resource, "leases");
        assert_eq!(r.name.as_deref(), Some("valkey-coordinator"));
        assert_eq!(r.code, Some(200));
        assert_eq!(r.user_agent, "valkey-sidecar/0.1.0");
    }

    #[test]
    fn other_users_subresources_and_paths() {
        let line = r#"{"auditID":"b","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/valkey/pods/p/status","verb":"patch","user":{"username":"testkit-admin"},"objectRef":{"resource":"pods","subresource":"status","name":"p"},"requestReceivedTimestamp":"1970-01-01T00:00:01Z"}"#;
        let r = parse_line(line).unwrap();
        assert_eq!(
            (r.who.as_str(), r.resource.as_str()),
            ("testkit-admin", "pods/status")
        );
        assert_eq!(r.received_us, 1_000_000);
        let line = r#"{"auditID":"c","requestURI":"/readyz?verbose","verb":"get","user":{"username":"system:anonymous"},"requestReceivedTimestamp":"1970-01-01T00:00:00.5Z"}"#;
        let r = parse_line(line).unwrap();
        assert_eq!((r.resource.as_str(), r.received_us), ("/readyz", 500_000));
        assert_eq!(parse_line("not json"), None);
        assert_eq!(parse_line("{}"), None);
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp_us("1970-01-01T00:00:00.000000Z"), Some(0));
        // date -u -d 2000-03-01T00:00:00 +%s
        assert_eq!(
            parse_timestamp_us("2000-03-01T00:00:00Z"),
            Some(951_868_800_000_000)
        );
        // date -u -d 2026-11-29T23:41:58 +%s
        assert_eq!(
            parse_timestamp_us("2026-11-29T23:41:58.123456Z"),
            Some(1_795_995_718_123_456)
        );
        assert_eq!(parse_timestamp_us("2026-11-29T23:41:58+01:00"), None);
        assert_eq!(parse_timestamp_us("2026-13-29T23:41:58Z"), None);
    }

    #[test]
    fn a_window_counts_each_request_once_by_when_it_was_received() {
        let started = LEASE_UPDATE.replace("ResponseComplete", "ResponseStarted");
        let later = LEASE_UPDATE
            .replace("\"a1\"", "\"a2\"")
            .replace("23:41:58.123456", "23:42:58.123456");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        std::fs::write(
            &path,
            [started.as_str(), LEASE_UPDATE, &later, "garbage"].join("\n"),
        )
        .unwrap();
        let at = |us: i64| UNIX_EPOCH + Duration::from_micros(u64::try_from(us).unwrap());
        let from = at(parse_timestamp_us("2026-11-29T23:41:00Z").unwrap());
        let to = at(parse_timestamp_us("2026-11-29T23:42:00Z").unwrap());
        let usage = AuditLog::new(&path).usage(from, to).unwrap();
        let who = pod_identity("valkey", "valkey-1-0");
        assert_eq!(usage.get(&who, "update", "leases"), 1);
        assert_eq!(usage.writes(&who), 1);
        assert_eq!(usage.total(&who), 1);
        assert!((usage.per_minute(1) - 1.0).abs() < 1e-9);
        let table = usage.verb_table(&[("coordinator".into(), who.clone())]);
        assert!(
            table.contains("| coordinator | 0.0 | 0.0 | 0.0 | 0.0 | 1.0 | 0.0 | 0.0 | 1.0 | 1.0 |"),
            "{table}"
        );
        let detail = usage.detail_table(&[("coordinator".into(), who)]);
        assert!(
            detail.contains("| coordinator | update | leases | 1 | 1.0 |"),
            "{detail}"
        );
    }
}
