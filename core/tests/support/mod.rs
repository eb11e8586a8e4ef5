//! What the replication-mode tables and properties share: lease timings, records, local views,
//! shard members and switchover plans.
// Each test file uses its own part of it.
#![allow(dead_code)]

use valkey_sidecar_core::lease::LeaseTimings;
use valkey_sidecar_core::observation::{History, Role};
use valkey_sidecar_core::replication::{
    Holding, LocalRole, LocalValkey, LocalView, MemberValkey, RecordHandoverPlan, SeenRecord,
    ShardMember, ShardRecord, ShardView, Successor,
};
use valkey_sidecar_core::time::Millis;

pub const T: LeaseTimings = LeaseTimings {
    lease_ms: 15_000,
    renew_deadline_ms: 10_000,
    retry_ms: 2_000,
};

pub fn record(holder: Option<&str>, primary: Option<&str>, epoch: u64) -> ShardRecord {
    ShardRecord {
        lease_ms: None,
        holder: holder.map(str::to_owned),
        primary: primary.map(str::to_owned),
        epoch,
        version: format!("v{epoch}"),
    }
}

pub fn seen(record: Option<ShardRecord>, read_at: u64) -> SeenRecord {
    SeenRecord {
        last_epoch: record.as_ref().map(|r| r.epoch),
        record,
        read_at: Millis(read_at),
        heard_at: Millis(read_at),
        changed_at: Millis(read_at),
    }
}

pub fn master(run: &str, since: u64) -> LocalValkey {
    LocalValkey {
        role: LocalRole::Primary,
        fresh: false,
        run_id: run.into(),
        since: Millis(since),
        observed_at: Millis(since),
        history: stream("A", 1_000),
        linked: false,
    }
}

/// A stream `replid` at `offset`, never promoted.
pub fn stream(replid: &str, offset: u64) -> History {
    History {
        replid: replid.into(),
        offset,
        replid2: None,
        second_offset: None,
        keys: 100,
    }
}

/// A master promoted from stream `from` at offset `at` (its first own offset `at + 1`), now at
/// `offset` of its own stream `replid`.
pub fn promoted(replid: &str, offset: u64, from: &str, at: u64) -> Successor {
    Successor {
        primary: true,
        history: History {
            replid2: Some(from.into()),
            second_offset: Some(at + 1),
            ..stream(replid, offset)
        },
    }
}

pub fn replica_of(of: &str, since: u64) -> LocalValkey {
    LocalValkey {
        role: LocalRole::Replica { of: of.into() },
        ..master("run", since)
    }
}

pub fn holding(epoch: u64, at: u64, run: &str) -> Holding {
    Holding {
        epoch,
        renewed_at: Millis(at),
        run_id: run.into(),
    }
}

/// pod-0, node-index 0, at `now`; nothing known yet.
pub fn view(now: u64) -> LocalView {
    LocalView {
        now: Millis(now),
        me: "pod-0".into(),
        node_index: Some(0),
        timings: T,
        valkey: None,
        record: None,
        holding: None,
        fenced_until: None,
        primary_addr: None,
        other_master: false,
        peers: None,
        promise: None,
        successor: None,
    }
}

/// pod-0 is the primary on record (epoch 3), renewed at `renewed`, its Valkey master.
pub fn holder_view(now: u64, renewed: u64) -> LocalView {
    LocalView {
        valkey: Some(master("run", 0)),
        record: Some(seen(Some(record(Some("pod-0"), Some("pod-0"), 3)), renewed)),
        holding: Some(holding(3, renewed, "run")),
        primary_addr: Some("10.0.0.10:6379".into()),
        ..view(now)
    }
}

/// pod-1 is the primary on record (epoch 4), read at 5 s, promoted from pod-0's stream `A` at
/// offset 1,000 (where [`master`] stands); pod-0's Valkey given by the caller.
pub fn follower_view(valkey: LocalValkey) -> LocalView {
    LocalView {
        valkey: Some(valkey),
        record: Some(seen(Some(record(Some("pod-1"), Some("pod-1"), 4)), 5_000)),
        primary_addr: Some("10.0.0.11:6379".into()),
        successor: Some(promoted("B", 1_200, "A", 1_000)),
        ..view(6_000)
    }
}

pub fn member(pod: &str, role: Role, offset: u64, zone: &str) -> ShardMember {
    ShardMember {
        pod: pod.into(),
        valkey: Some(MemberValkey {
            role,
            offset,
            link_up: role == Role::Replica,
            fresh: false,
            keys: 10,
        }),
        zone: Some(zone.into()),
        terminating: false,
        node_ready: true,
        node_schedulable: true,
    }
}

/// pod-0 holds the record (epoch 5, seen changing at 0); pod-1 and pod-2 replicate.
pub fn shard(now: u64) -> ShardView {
    ShardView {
        now: Millis(now),
        coordinating: true,
        record: Some(seen(Some(record(Some("pod-0"), Some("pod-0"), 5)), 0)),
        lease_ms: 15_000,
        members: vec![
            member("pod-0", Role::Primary, 1_000, "a"),
            member("pod-1", Role::Replica, 900, "b"),
            member("pod-2", Role::Replica, 950, "c"),
        ],
        preferred_zone: Some("a".into()),
    }
}

pub fn plan() -> RecordHandoverPlan {
    RecordHandoverPlan {
        from: "pod-0".into(),
        to: "pod-1".into(),
        to_addr: "10.0.0.11 6379".into(),
        others: vec!["pod-2".into()],
        epoch: 5,
        timeout_ms: 5_000,
    }
}
