//! The coordinator's status for humans: conditions computed from the planner's output and the
//! world, rendered as annotations on the coordinator Lease.
//!
//! Only the Lease holder computes the status and it travels in the renewals the holder writes
//! anyway, so it costs no extra API write and never has two writers. It is output only: no
//! decision ever reads it back, which is why a wall-clock time is fine in it.

use std::collections::{BTreeMap, BTreeSet};

use crate::plan::{Kind, Plan, Policy, Shards, World, candidates};
use crate::requests::{ANSWER, SwitchoverAnswer};

/// The prefix of every status annotation.
pub const PREFIX: &str = "status.valkey.io/";
/// Every primary runs in its shard's preferred zone.
pub const PLACEMENT: &str = "PrimaryPlacementAligned";
/// No node carries more primaries than the cap.
pub const BALANCE: &str = "PrimariesBalanced";
/// Every primary could be handed over now, and no needed hand-over is blocked.
pub const HANDOVER: &str = "HandoverReady";
/// Every pod runs its StatefulSet's update revision (only with the supervised roll).
pub const ROLLED: &str = "RolloutComplete";
/// Condition: every pod is scheduled and no shard has two members on one node or in one zone.
pub const SCHEDULING: &str = "SchedulingSatisfied";

/// One condition, in the manner of Kubernetes `status.conditions`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

/// The last move the holder started, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub kind: Kind,
    pub shard: String,
    pub reason: String,
    /// `started` until the move ends, then `ok`, `failed` or `no_lease`.
    pub result: &'static str,
    /// Wall-clock start time (RFC 3339), for humans only.
    pub at: String,
}

/// What the holder publishes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Status {
    pub conditions: Vec<Condition>,
    pub last_decision: Option<Decision>,
    /// The pause the holder honours (the request's value), shown as the `Paused` condition.
    pub paused: Option<String>,
    /// The answer to the last switchover request.
    pub answer: Option<SwitchoverAnswer>,
}

/// Condition: the coordinator is paused (`valkey-sidecar pause`), acknowledged by the holder.
pub const PAUSED: &str = "Paused";

/// The conditions of one planning round, in a fixed order.
pub fn conditions(world: &World, policy: &Policy, plan: &Plan) -> Vec<Condition> {
    let mut all = vec![
        placement(plan, policy),
        balance(plan, policy),
        handover(world, plan),
        scheduling(plan),
    ];
    all.extend(policy.roll.map(|_| rollout(plan)));
    all
}

/// The supervised roll: done, under way, or waiting and why.
fn rollout(plan: &Plan) -> Condition {
    let left = plan.roll_outdated;
    match &plan.roll_waiting {
        _ if left == 0 => holds(ROLLED, "UpToDate", "every pod runs its update revision"),
        Some(why) => fails(
            ROLLED,
            "RollWaiting",
            format!("{left} pods to replace; {why}"),
        ),
        None => fails(ROLLED, "Rolling", format!("{left} pods to replace")),
    }
}

/// The conditions while the holder has no fresh view: it cannot vouch for any of them, so each
/// is False with a reason that says why rather than keeping an old True.
pub fn without_view() -> Vec<Condition> {
    [PLACEMENT, BALANCE, HANDOVER, SCHEDULING]
        .into_iter()
        .map(|type_| Condition {
            type_,
            status: false,
            reason: "NoFreshView",
            message: "the Lease holder has no fresh view of the cluster from its Valkey".into(),
        })
        .collect()
}

fn holds(type_: &'static str, reason: &'static str, message: &str) -> Condition {
    Condition {
        type_,
        status: true,
        reason,
        message: message.into(),
    }
}

fn fails(type_: &'static str, reason: &'static str, message: String) -> Condition {
    Condition {
        type_,
        status: false,
        reason,
        message,
    }
}

/// The drift messages of one reason, each naming its shard when it has one.
fn drift_messages(plan: &Plan, reason: &str) -> Vec<String> {
    plan.drift
        .iter()
        .filter(|d| d.reason == reason)
        .map(|d| match d.shard.as_str() {
            "" => d.message.clone(),
            shard => format!("shard {shard}: {}", d.message),
        })
        .collect()
}

/// Says so when the policy that would fix a drift is off, so nobody waits for it.
fn off_note(on: bool, setting: &str) -> String {
    if on {
        String::new()
    } else {
        format!(" ({setting} is off)")
    }
}

fn placement(plan: &Plan, policy: &Policy) -> Condition {
    let found = drift_messages(plan, "FailoverDrift");
    if found.is_empty() {
        return holds(
            PLACEMENT,
            "Aligned",
            "no primary runs outside its shard's preferred zone",
        );
    }
    let note = off_note(policy.failback, "fail-back");
    fails(PLACEMENT, "FailoverDrift", found.join("; ") + &note)
}

fn balance(plan: &Plan, policy: &Policy) -> Condition {
    let found = drift_messages(plan, "PrimaryImbalance");
    if found.is_empty() {
        return holds(
            BALANCE,
            "Balanced",
            "no node carries more primaries than ceil(primaries / usable nodes)",
        );
    }
    let note = off_note(policy.balance, "balance");
    fails(BALANCE, "PrimaryImbalance", found.join("; ") + &note)
}

/// Pending pods first (something is not running at all), then members sharing a node, then a
/// zone: the worst fact gives the reason, every fact of it the message.
fn scheduling(plan: &Plan) -> Condition {
    for reason in ["Unschedulable", "ShardSharesNode", "ShardSharesZone"] {
        let found = drift_messages(plan, reason);
        if !found.is_empty() {
            return fails(SCHEDULING, reason, found.join("; "));
        }
    }
    holds(
        SCHEDULING,
        "Satisfied",
        "every pod is scheduled; no shard has two members on one node or in one zone",
    )
}

fn handover(world: &World, plan: &Plan) -> Condition {
    if !plan.blocked.is_empty() {
        return fails(HANDOVER, "HandoverBlocked", plan.blocked.join("; "));
    }
    let shards = Shards::new(world);
    let bare: Vec<String> = shards_with_primary(world)
        .into_iter()
        .filter(|s| candidates(&shards, s, None).is_empty())
        .map(|s| format!("shard {s}"))
        .collect();
    if bare.is_empty() {
        return holds(
            HANDOVER,
            "CandidatesAvailable",
            "every primary has a synced, Ready replica to hand over to",
        );
    }
    let message = format!(
        "no synced, Ready replica on a usable node: {}",
        bare.join(", ")
    );
    fails(HANDOVER, "NoCandidate", message)
}

/// Shards with a live primary (a shard without one is Valkey's own failover's business).
fn shards_with_primary(world: &World) -> BTreeSet<&str> {
    world
        .members
        .iter()
        .filter(|m| m.is_live_primary())
        .map(|m| m.shard.as_str())
        .collect()
}

/// The annotations the holder writes: one per condition (`"<True|False> <Reason>: <message>"`),
/// the last decision when there was one, and `updated`, when the status last changed.
/// Each value is cut at [`MAX_VALUE_CHARS`], so a message listing every shard of a large cluster
/// can never push the Lease towards the object size limit (a failing write is a failing renewal).
pub fn annotations(status: &Status, updated: &str) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = status
        .conditions
        .iter()
        .map(|c| (format!("{PREFIX}{}", c.type_), capped(render(c))))
        .collect();
    if let Some(d) = &status.last_decision {
        out.insert(format!("{PREFIX}last-decision"), capped(decision(d)));
    }
    if let Some(p) = &status.paused {
        let paused = holds(PAUSED, "Requested", p);
        out.insert(format!("{PREFIX}{PAUSED}"), capped(render(&paused)));
    }
    if let Some(a) = &status.answer {
        out.insert(ANSWER.to_owned(), capped(a.render()));
    }
    out.insert(format!("{PREFIX}updated"), updated.to_owned());
    out
}

/// The longest annotation value the holder writes; with a fixed set of conditions the status stays
/// under 16 KiB, whatever the cluster's size.
pub const MAX_VALUE_CHARS: usize = 2048;

fn capped(value: String) -> String {
    let total = value.chars().count();
    if total <= MAX_VALUE_CHARS {
        return value;
    }
    let note = format!(" … ({} more characters)", total - (MAX_VALUE_CHARS - 64));
    value.chars().take(MAX_VALUE_CHARS - 64).collect::<String>() + &note
}

fn render(c: &Condition) -> String {
    let status = if c.status { "True" } else { "False" };
    format!("{status} {}: {}", c.reason, c.message)
}

fn decision(d: &Decision) -> String {
    format!(
        "{} of shard {} at {}: {} ({})",
        d.kind.as_str(),
        d.shard,
        d.at,
        d.result,
        d.reason
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observation::Role;
    use crate::plan::{Drift, Member, NodeInfo, PodInfo, decide};
    use crate::shards::NodeHealth;

    fn member(id: &str, shard: &str, role: Role, offset: u64, node: &str) -> Member {
        Member {
            id: id.into(),
            shard: shard.into(),
            role,
            offset,
            health: NodeHealth::Online,
            pod: Some(PodInfo {
                name: format!("pod-{id}"),
                node: Some(node.into()),
                ready: true,
                terminating: false,
                node_index: Some(u32::from(role == Role::Replica)),
                zone: None,
                ..PodInfo::default()
            }),
        }
    }

    /// Two shards, primaries on n0 (zone a) and n1 (zone b), each with a replica elsewhere.
    fn world() -> World {
        let nodes = (0..4)
            .map(|i| {
                let node = NodeInfo {
                    zone: Some(["a", "b"][i % 2].into()),
                    ready: true,
                    unschedulable: false,
                };
                (format!("n{i}"), node)
            })
            .collect();
        World {
            coordinating: true,
            members: vec![
                member("p0", "s0", Role::Primary, 100, "n0"),
                member("r0", "s0", Role::Replica, 100, "n3"),
                member("p1", "s1", Role::Primary, 100, "n1"),
                member("r1", "s1", Role::Replica, 100, "n2"),
            ],
            nodes,
            ..World::default()
        }
    }

    fn drift(shard: &str, reason: &'static str, message: &str) -> Drift {
        Drift {
            shard: shard.into(),
            reason,
            message: message.into(),
            pod: None,
        }
    }

    /// (type, status, reason, message) of each condition.
    fn summary(c: &[Condition]) -> Vec<(&str, bool, &str, &str)> {
        c.iter()
            .map(|c| (c.type_, c.status, c.reason, c.message.as_str()))
            .collect()
    }

    /// (case, plan, policy, condition type, wanted (status, reason, message)).
    type Case<'a> = (&'a str, Plan, &'a Policy, &'a str, (bool, &'a str, &'a str));

    /// A change that leaves shard s0 without a hand-over candidate.
    type Change = fn(&mut World);

    #[test]
    fn conditions_from_plans() {
        let failback = Policy {
            failback: true,
            ..Policy::default()
        };
        let off = Policy::default();
        let zone = drift(
            "s0",
            "FailoverDrift",
            "primary p0 runs in zone b, preferred a",
        );
        let zone2 = drift(
            "s1",
            "FailoverDrift",
            "primary p1 runs in zone a, preferred b",
        );
        let crowded = drift(
            "",
            "PrimaryImbalance",
            "node n0 carries 2 primaries (cap 1)",
        );
        let blocked = "shard s0: node n0 is cordoned, but no synced replica can take over";
        let cases: Vec<Case> = vec![
            (
                "aligned",
                Plan::default(),
                &failback,
                PLACEMENT,
                (
                    true,
                    "Aligned",
                    "no primary runs outside its shard's preferred zone",
                ),
            ),
            (
                "one shard drifted",
                Plan {
                    drift: vec![zone.clone()],
                    ..Plan::default()
                },
                &failback,
                PLACEMENT,
                (
                    false,
                    "FailoverDrift",
                    "shard s0: primary p0 runs in zone b, preferred a",
                ),
            ),
            (
                "two shards drifted, fail-back off",
                Plan {
                    drift: vec![zone, zone2, crowded.clone()],
                    ..Plan::default()
                },
                &off,
                PLACEMENT,
                (
                    false,
                    "FailoverDrift",
                    "shard s0: primary p0 runs in zone b, preferred a; shard s1: primary p1 runs in zone a, preferred b (fail-back is off)",
                ),
            ),
            (
                "balanced",
                Plan::default(),
                &failback,
                BALANCE,
                (
                    true,
                    "Balanced",
                    "no node carries more primaries than ceil(primaries / usable nodes)",
                ),
            ),
            (
                "crowded node",
                Plan {
                    drift: vec![crowded],
                    ..Plan::default()
                },
                &failback,
                BALANCE,
                (
                    false,
                    "PrimaryImbalance",
                    "node n0 carries 2 primaries (cap 1)",
                ),
            ),
            (
                "candidates everywhere",
                Plan::default(),
                &failback,
                HANDOVER,
                (
                    true,
                    "CandidatesAvailable",
                    "every primary has a synced, Ready replica to hand over to",
                ),
            ),
            (
                "a needed hand-over is blocked",
                Plan {
                    blocked: vec![blocked.into()],
                    ..Plan::default()
                },
                &failback,
                HANDOVER,
                (false, "HandoverBlocked", blocked),
            ),
            (
                "scheduled and spread",
                Plan::default(),
                &failback,
                SCHEDULING,
                (
                    true,
                    "Satisfied",
                    "every pod is scheduled; no shard has two members on one node or in one zone",
                ),
            ),
            (
                "a zone shared, and a pod pending: the pending pod is the worse",
                Plan {
                    drift: vec![
                        drift("s0", "ShardSharesZone", "pods a, b share zone z"),
                        drift(
                            "",
                            "Unschedulable",
                            "pod c is not scheduled (Unschedulable): 0/2 nodes",
                        ),
                    ],
                    ..Plan::default()
                },
                &failback,
                SCHEDULING,
                (
                    false,
                    "Unschedulable",
                    "pod c is not scheduled (Unschedulable): 0/2 nodes",
                ),
            ),
        ];
        for (name, plan, policy, type_, want) in cases {
            let got = conditions(&world(), policy, &plan);
            let c = got.iter().find(|c| c.type_ == type_).unwrap();
            assert_eq!(
                (c.status, c.reason, c.message.as_str()),
                want,
                "case {name}"
            );
        }
    }

    #[test]
    fn a_shard_without_a_synced_ready_replica_is_not_ready_for_a_handover() {
        let cases: Vec<(&str, Change)> = vec![
            ("loading", |w| w.members[1].health = NodeHealth::Loading),
            ("unready pod (its agent judged it behind)", |w| {
                if let Some(p) = w.members[1].pod.as_mut() {
                    p.ready = false;
                }
            }),
            ("cordoned node", |w| {
                if let Some(n) = w.nodes.get_mut("n3") {
                    n.unschedulable = true;
                }
            }),
            ("no replica", |w| {
                w.members.remove(1);
            }),
        ];
        for (name, change) in cases {
            let mut w = world();
            change(&mut w);
            let got = conditions(&w, &Policy::default(), &Plan::default());
            assert_eq!(
                summary(&got)[2],
                (
                    HANDOVER,
                    false,
                    "NoCandidate",
                    "no synced, Ready replica on a usable node: shard s0"
                ),
                "case {name}"
            );
        }
    }

    #[test]
    fn the_planners_drift_becomes_a_false_condition() {
        let mut w = world();
        // Shard s1's preferred zone is b (its node-index-0 pod is p1 on n1); move p1 to zone a.
        w.members[2] = member("p1", "s1", Role::Primary, 100, "n2");
        w.members[2].pod.as_mut().unwrap().node_index = Some(1);
        w.members[3] = member("r1", "s1", Role::Replica, 100, "n1");
        w.members[3].pod.as_mut().unwrap().node_index = Some(0);
        let policy = Policy::default();
        let got = conditions(&w, &policy, &decide(&w, &policy));
        assert_eq!(
            summary(&got)[0],
            (
                PLACEMENT,
                false,
                "FailoverDrift",
                "shard s1: primary p1 runs in zone a, preferred b (fail-back is off)"
            )
        );
    }

    #[test]
    fn members_sharing_a_node_or_zone_and_pending_pods_are_drift() {
        let mut w = world();
        // r0 moves next to p0 (n0): node and zone shared.
        w.members[1] = member("r0", "s0", Role::Replica, 100, "n0");
        w.pending.push(crate::plan::Pending {
            pod: "pod-x".into(),
            reason: "Unschedulable".into(),
            message: "0/4 nodes are available".into(),
        });
        let policy = Policy::default();
        let plan = decide(&w, &policy);
        let reasons: Vec<(&str, &str)> = plan
            .drift
            .iter()
            .map(|d| (d.reason, d.message.as_str()))
            .collect();
        assert!(
            reasons.contains(&("ShardSharesNode", "pods pod-p0, pod-r0 share node n0")),
            "{reasons:?}"
        );
        assert!(
            reasons.contains(&("ShardSharesZone", "pods pod-p0, pod-r0 share zone a")),
            "{reasons:?}"
        );
        let got = conditions(&w, &policy, &plan);
        let c = got.iter().find(|c| c.type_ == SCHEDULING).unwrap();
        assert_eq!((c.status, c.reason), (false, "Unschedulable"));
        assert!(
            c.message
                .contains("pod pod-x is not scheduled (Unschedulable): 0/4 nodes")
        );
        w.pending.clear();
        let got = conditions(&w, &policy, &decide(&w, &policy));
        let c = got.iter().find(|c| c.type_ == SCHEDULING).unwrap();
        assert_eq!((c.status, c.reason), (false, "ShardSharesNode"));
    }

    #[test]
    fn without_a_view_nothing_is_vouched_for() {
        let got = without_view();
        assert_eq!(got.len(), 4);
        assert!(got.iter().all(|c| !c.status && c.reason == "NoFreshView"));
    }

    #[test]
    fn annotations_are_rendered_deterministically() {
        let status = Status {
            conditions: vec![
                fails(
                    PLACEMENT,
                    "FailoverDrift",
                    "shard s0: primary p0 in b".into(),
                ),
                holds(HANDOVER, "CandidatesAvailable", "ok"),
            ],
            last_decision: Some(Decision {
                kind: Kind::FailBack,
                shard: "s0".into(),
                reason: "primary is in zone b, the shard prefers a".into(),
                result: "ok",
                at: "2026-01-02T03:04:05Z".into(),
            }),
            paused: Some("since 2026-01-02T03:00:00Z: kernel upgrade".into()),
            answer: Some(SwitchoverAnswer {
                id: "k1".into(),
                outcome: crate::requests::Outcome::Refused,
                message: "shard 0 has no live primary".into(),
            }),
        };
        let got = annotations(&status, "2026-01-02T03:04:06Z");
        let want = [
            (
                "status.valkey.io/HandoverReady",
                "True CandidatesAvailable: ok",
            ),
            (
                "status.valkey.io/Paused",
                "True Requested: since 2026-01-02T03:00:00Z: kernel upgrade",
            ),
            (
                "status.valkey.io/PrimaryPlacementAligned",
                "False FailoverDrift: shard s0: primary p0 in b",
            ),
            (
                "status.valkey.io/last-decision",
                "FailBack of shard s0 at 2026-01-02T03:04:05Z: ok (primary is in zone b, the shard prefers a)",
            ),
            (
                "status.valkey.io/switchover",
                "k1 refused: shard 0 has no live primary",
            ),
            ("status.valkey.io/updated", "2026-01-02T03:04:06Z"),
        ];
        let got: Vec<(&str, &str)> = got.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn long_messages_are_capped() {
        let shards: Vec<String> = (0..2000)
            .map(|i| format!("shard s{i}: primary p{i} in b"))
            .collect();
        let status = Status {
            conditions: vec![fails(PLACEMENT, "FailoverDrift", shards.join("; "))],
            ..Status::default()
        };
        let got = annotations(&status, "t");
        let value = &got["status.valkey.io/PrimaryPlacementAligned"];
        assert!(value.chars().count() <= MAX_VALUE_CHARS, "{}", value.len());
        assert!(
            value.starts_with("False FailoverDrift: shard s0:"),
            "{value}"
        );
        assert!(value.ends_with("more characters)"), "{value}");
    }

    #[test]
    fn no_decision_no_annotation() {
        let got = annotations(&Status::default(), "t");
        assert_eq!(got.keys().collect::<Vec<_>>(), ["status.valkey.io/updated"]);
    }
}
