//! `check::decide` (`helm test`): one table row per way a deployment can be unhealthy, each
//! problem naming its shard.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use valkey_sidecar_core::check::{CheckView, LeaseFacts, PodFacts, decide};
use valkey_sidecar_core::observation::Role;

fn pod(name: &str, shard: &str, role: Option<Role>, ready: bool) -> PodFacts {
    PodFacts {
        name: name.into(),
        shard: Some(shard.into()),
        role,
        ready,
    }
}

/// Two shards of two pods, healthy, the Lease held by v-1-1 and renewed.
fn healthy() -> CheckView {
    CheckView {
        shards: 2,
        pods_per_shard: 2,
        pods: vec![
            pod("v-0-0", "0", Some(Role::Primary), true),
            pod("v-0-1", "0", Some(Role::Replica), true),
            pod("v-1-0", "1", Some(Role::Replica), true),
            pod("v-1-1", "1", Some(Role::Primary), true),
        ],
        lease: Some(LeaseFacts {
            name: "v-coordinator".into(),
            holder: Some("v-1-1_8f0e1c".into()),
            renewed: true,
        }),
        lease_name: "v-coordinator".into(),
    }
}

#[test]
fn table() {
    type Change = fn(&mut CheckView);
    let rows: Vec<(&str, Change, Vec<&str>)> = vec![
        ("healthy", |_| {}, vec![]),
        (
            "no primary label",
            |v| v.pods[0].role = None,
            vec!["shard 0: no pod is labelled primary"],
        ),
        (
            "two primaries",
            |v| v.pods[2].role = Some(Role::Primary),
            vec!["shard 1: 2 pods are labelled primary (v-1-0, v-1-1)"],
        ),
        (
            "a replica not Ready",
            |v| v.pods[1].ready = false,
            vec!["shard 0: not Ready: v-0-1"],
        ),
        (
            "a pod missing (refused by admission, say)",
            |v| {
                v.pods.remove(3);
            },
            vec![
                "shard 1: 1 of 2 pods exist",
                "shard 1: no pod is labelled primary",
                "the coordinator Lease v-coordinator is held by v-1-1_8f0e1c, no pod of this deployment",
            ],
        ),
        (
            "a whole shard missing",
            |v| v.pods.retain(|p| p.shard.as_deref() != Some("1")),
            vec![
                "shard 1: 0 of 2 pods exist",
                "shard 1: no pod is labelled primary",
                "the coordinator Lease v-coordinator is held by v-1-1_8f0e1c, no pod of this deployment",
            ],
        ),
        (
            "a pod of another shard",
            |v| v.pods.push(pod("v-7-0", "7", None, true)),
            vec!["pods of no shard of this release (shard 7): v-7-0"],
        ),
        (
            "no Lease",
            |v| v.lease = None,
            vec!["the coordinator Lease v-coordinator does not exist"],
        ),
        (
            "a released Lease",
            |v| v.lease.as_mut().unwrap().holder = Some(String::new()),
            vec!["the coordinator Lease v-coordinator is not held"],
        ),
        (
            "a Lease nobody renews",
            |v| v.lease.as_mut().unwrap().renewed = false,
            vec![
                "the coordinator Lease v-coordinator (held by v-1-1_8f0e1c) was not renewed within its duration",
            ],
        ),
    ];
    for (name, change, want) in rows {
        let mut view = healthy();
        change(&mut view);
        assert_eq!(decide(&view), want, "{name}");
    }
}
