//! `valkey-sidecar status`: one table per cluster for an operator — each shard's pods with their
//! live role, readiness, zone, node and whether they run their StatefulSet's update revision; the
//! coordinator Lease's holder and the status it publishes (conditions, the last decision); a roll
//! in progress. Read-only: built from what the API holds, judged by no rule.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::observation::Role;

/// One pod, as the API has it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodRow {
    /// `valkey.io/shard-index` (`?` without it).
    pub shard: String,
    pub name: String,
    /// The live role label.
    pub role: Option<Role>,
    pub ready: bool,
    pub terminating: bool,
    pub zone: Option<String>,
    pub node: Option<String>,
    /// Whether it runs its StatefulSet's update revision; `None`: not known.
    pub updated: Option<bool>,
}

/// What `status` shows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Overview {
    pub cluster: String,
    pub pods: Vec<PodRow>,
    /// The coordinator Lease's holder (`<pod>_<uid>`); `None`: not held, or no Lease.
    pub coordinator: Option<String>,
    /// The holder's status annotations without their prefix (`HandoverReady`, `last-decision`, …).
    pub status: BTreeMap<String, String>,
    /// The pause asked for (`valkey-sidecar pause`), whether or not a holder has seen it yet.
    pub paused: Option<String>,
}

impl Overview {
    /// Pods not at their update revision: a roll is under way while any is left.
    pub fn outdated(&self) -> usize {
        self.pods
            .iter()
            .filter(|p| p.updated == Some(false))
            .count()
    }
}

/// The table and the coordinator's lines, as printed.
pub fn table(o: &Overview) -> String {
    let mut rows = vec![header()];
    let mut pods: Vec<&PodRow> = o.pods.iter().collect();
    pods.sort_by(|a, b| (&a.shard, &a.name).cmp(&(&b.shard, &b.name)));
    rows.extend(pods.into_iter().map(row));
    let mut out = columns(&rows);
    let holder = o
        .coordinator
        .as_deref()
        .unwrap_or("none (no agent holds the Lease)");
    let _ = writeln!(out, "\ncoordinator: {holder}");
    if let Some(p) = &o.paused {
        let _ = writeln!(
            out,
            "paused: {p} (no fail-back, balance, roll or cordon hand-over until `resume`)"
        );
    }
    for (key, value) in &o.status {
        let _ = writeln!(out, "  {key}: {value}");
    }
    let _ = writeln!(out, "{}", roll_line(o));
    out
}

fn roll_line(o: &Overview) -> String {
    match o.outdated() {
        0 => "rollout: every pod runs its update revision".to_owned(),
        n => format!(
            "rollout: {n} of {} pods not at their update revision yet",
            o.pods.len()
        ),
    }
}

fn header() -> Vec<String> {
    ["SHARD", "POD", "ROLE", "READY", "ZONE", "NODE", "UPDATED"]
        .map(String::from)
        .to_vec()
}

fn row(p: &PodRow) -> Vec<String> {
    let role = match p.role {
        Some(Role::Primary) => "primary",
        Some(Role::Replica) => "replica",
        _ => "-",
    };
    let ready = match (p.terminating, p.ready) {
        (true, _) => "terminating",
        (false, true) => "yes",
        (false, false) => "no",
    };
    let updated = match p.updated {
        Some(true) => "yes",
        Some(false) => "no",
        None => "?",
    };
    let or_dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
    vec![
        p.shard.clone(),
        p.name.clone(),
        role.into(),
        ready.into(),
        or_dash(&p.zone),
        or_dash(&p.node),
        updated.into(),
    ]
}

/// Rows padded into columns two spaces apart.
fn columns(rows: &[Vec<String>]) -> String {
    let width = |i: usize| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0);
    let widths: Vec<usize> = (0..rows[0].len()).map(width).collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = r
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(shard: &str, name: &str, role: Option<Role>, updated: Option<bool>) -> PodRow {
        PodRow {
            shard: shard.into(),
            name: name.into(),
            role,
            ready: true,
            zone: Some("zone-a".into()),
            node: Some("node-a1".into()),
            updated,
            ..PodRow::default()
        }
    }

    #[test]
    fn the_table_shows_each_pod_the_coordinator_and_the_roll() {
        let o = Overview {
            cluster: "valkey".into(),
            pods: vec![
                pod("1", "valkey-1-0", Some(Role::Primary), Some(true)),
                pod("0", "valkey-0-1", None, Some(false)),
                pod("0", "valkey-0-0", Some(Role::Replica), None),
            ],
            coordinator: Some("valkey-0-0_uid".into()),
            status: BTreeMap::from([("RolloutComplete".into(), "False Rolling: 1 pods".into())]),
            paused: Some("since 2026-12-04T00:00:00Z by ops: kernel upgrade".into()),
        };
        let text = table(&o);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "SHARD  POD         ROLE     READY  ZONE    NODE     UPDATED"
        );
        assert_eq!(
            lines[1],
            "0      valkey-0-0  replica  yes    zone-a  node-a1  ?"
        );
        assert_eq!(
            lines[2],
            "0      valkey-0-1  -        yes    zone-a  node-a1  no"
        );
        assert!(text.contains("coordinator: valkey-0-0_uid"), "{text}");
        assert!(
            text.contains("paused: since 2026-12-04T00:00:00Z by ops: kernel upgrade (no"),
            "{text}"
        );
        assert!(
            text.contains("  RolloutComplete: False Rolling: 1 pods"),
            "{text}"
        );
        assert!(
            text.contains("rollout: 1 of 3 pods not at their update revision yet"),
            "{text}"
        );
    }
}
