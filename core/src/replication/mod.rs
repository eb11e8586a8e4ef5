//! Replication mode (Valkey without Cluster): the rules that replace Sentinel, as pure functions.
//!
//! Each shard is one primary and N replicas joined by plain `REPLICAOF`. Who may be primary is
//! written on a per-shard Lease, the [`ShardRecord`] (`<cluster>-<shard>-primary`): *whoever holds
//! it may be primary* (CloudNativePG 1.30). Three parties read it:
//!
//! - **every agent**, about its own Valkey: [`keeper::decide`] — renew the record, fence writes when the
//!   record can no longer be renewed, release it when Valkey is gone, follow the recorded primary,
//!   bootstrap the very first record;
//! - **the coordinator** (holder of the cluster Lease), when a primary is lost: [`promotion::decide`] — the
//!   only place a new epoch is chosen for an unplanned failover;
//! - **the coordinator**, for a planned move (pod deletion, drain, fail-back, balance): the
//!   [`RecordHandoverRun`] step machine — pause, catch up, write the record, promote, repoint, unpause.
//!
//! # Why it is safe
//! - *Never two writable primaries past the fencing deadline.* A holder counts its renew deadline
//!   from the moment it *sent* its last successful renewal; the coordinator promotes only after
//!   seeing the record unchanged for a full lease duration on its own monotonic clock, and the
//!   change it saw cannot predate that send. `lease > renew deadline`, so a holder that cannot
//!   renew reaches its deadline — and pauses its writes ([`LocalAction::Fence`]) — strictly
//!   before anyone may promote. The gap (`lease − renew deadline`, 5 s by default) is the time the
//!   `CLIENT PAUSE` has to land in; the adapter wakes at the deadline rather than at its next tick.
//! - More generally, a Valkey that is master accepts writes only while its agent holds a valid
//!   renewal of a record naming it ([`Holding`]); every other master is fenced or demoted.
//! - *No acknowledged write lost in a hand-over.* The old primary's writes are paused before its
//!   offset is read, and the record moves only once the target has replicated up to that offset.
//! - *Only the coordinator promotes.* No local action makes a Valkey primary: agents renew what
//!   the record already says, and create the record only when none exists
//!   ([`LocalAction::Bootstrap`]).
//! - Every interval is judged on the local monotonic clock ([`Millis`](crate::time::Millis)); `renewTime` is never read.
//!
//! # Layout
//! - [`record`]: the [`ShardRecord`] and [`SeenRecord`];
//! - [`keeper`]: every agent's [`keeper::decide`] rules;
//! - [`promotion`]: the coordinator's [`promotion::decide`];
//! - [`promotion_run`]: a decided promotion carried out step by step ([`PromotionRun`]);
//! - [`handover`]: the planned [`RecordHandoverRun`].

pub mod handover;
pub mod keeper;
pub mod promotion;
pub mod promotion_run;
pub mod record;

pub use crate::lease::{MAX_LEASE_MS, judged_lease_ms};
// Named, not globbed: each module's entry point is `decide` (`keeper::decide`,
// `promotion::decide`), called through its module.
pub use handover::*;
pub use keeper::{
    ADDR_RECHECK_MS, ADDR_REFRESH_MS, Claim, Holding, LocalAction, LocalRole, LocalValkey,
    LocalView, NOT_FOLLOWING, RunTrust, Successor, ValkeyMemory, address_fresh, awaiting_promotion,
    claim, may_advertise, successor_wanted, unvouched,
};
pub use promotion::{
    FailoverPolicy, Hold, HoldKind, MemberValkey, Promotion, ShardMember, ShardView, candidates,
};
pub use promotion_run::{
    PromotionAnswer, PromotionCommand, PromotionRun, PromotionStep, PromotionStop, WithoutLease,
};
pub use record::*;
