//! The coordinator's book of moves ([`Ledger`]): which shards have a move running, which have one
//! that finished but does not show in the view yet (settling), and when the last move that starts
//! the cooldown began. The planner reads it as [`World::in_flight`](crate::plan::World) and
//! `World::last_move`; crash failovers and promotions ask [`Ledger::is_busy`] first, and a planned
//! move of this round goes before an unplanned one ([`Ledger::free_for_unplanned`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::observation::Role;
use crate::plan::{Action, InFlight, Kind, Member};
use crate::time::Millis;

/// How long a finished move may take to show in the view before its shard is planned again.
///
/// The coordinator's view comes from gossip (cluster mode) or its own reads, and lags a finished
/// failover by up to a few hundred milliseconds; while a move settles its shard counts as busy, so
/// the same move is not planned twice from a stale view.
pub const SETTLE_MS: u64 = 10_000;

/// What starts a move: a planned kind, or an unplanned failover (a crash, a lost primary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Started {
    Planned(Kind),
    Unplanned,
}

impl Started {
    /// Fail-back and balance are optional moves: each starts the cooldown before the next. A
    /// hand-over (a pod going away) and an unplanned failover are needed and start none.
    pub fn cools_down(self) -> bool {
        matches!(self, Started::Planned(Kind::FailBack | Kind::Rebalance))
    }
}

/// A finished move waiting for the view to show its new primary.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Settling {
    to: String,
    /// The primary it replaced, for a planned move: the view must stop showing it as primary too.
    from: Option<String>,
    started: Millis,
    until: Millis,
}

/// The moves the coordinator started and has not yet seen land.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Ledger {
    running: BTreeMap<String, Millis>,
    settling: BTreeMap<String, Settling>,
    last_move: Option<Millis>,
}

impl Ledger {
    /// Books a move of `shard` as started at `now`.
    pub fn start(&mut self, shard: &str, started: Started, now: Millis) {
        self.running.insert(shard.to_owned(), now);
        if started.cools_down() {
            self.last_move = Some(now);
        }
    }

    /// Books the end of a move of `shard`. One that made `to` primary in place of `from` (when
    /// known) settles until the view shows `to` as primary and `from` no longer as one, at most
    /// [`SETTLE_MS`]. A view that still shows the old primary beside the new one (gossip from a node
    /// of another Valkey version was seen to lag so) would otherwise plan the same move again: a
    /// second move of the shard.
    pub fn finish(&mut self, shard: &str, made: Option<(&str, Option<&str>)>, now: Millis) {
        let started = self.running.remove(shard).unwrap_or(now);
        if let Some((to, from)) = made {
            let until = now.plus(SETTLE_MS);
            let (to, from) = (to.to_owned(), from.map(str::to_owned));
            let settling = Settling {
                to,
                from,
                started,
                until,
            };
            self.settling.insert(shard.to_owned(), settling);
        }
    }

    /// Forgets settling moves whose new primary the members now show (and not the old one any
    /// more), or whose wait is over.
    pub fn settle(&mut self, members: &[Member], now: Millis) {
        let primary = |id: &str| {
            members
                .iter()
                .any(|m| m.id == id && m.role == Role::Primary)
        };
        self.settling.retain(|_, s| {
            let gone = s.from.as_deref().is_none_or(|f| !primary(f));
            let shown = primary(&s.to) && gone;
            !shown && now < s.until
        });
    }

    /// Running and settling moves: the planner leaves their shards alone.
    pub fn in_flight(&self) -> Vec<InFlight> {
        let running = self.running.iter().map(|(s, at)| (s, *at));
        let settling = self.settling.iter().map(|(s, m)| (s, m.started));
        let all = running.chain(settling);
        all.map(|(shard, started)| InFlight {
            shard: shard.clone(),
            started,
        })
        .collect()
    }

    /// A move of `shard` is running or settling.
    pub fn is_busy(&self, shard: &str) -> bool {
        self.running.contains_key(shard) || self.settling.contains_key(shard)
    }

    /// Every shard with a move running or settling.
    pub fn busy(&self) -> BTreeSet<String> {
        let running = self.running.keys();
        running.chain(self.settling.keys()).cloned().collect()
    }

    /// When the last move that starts the cooldown began.
    pub fn last_move(&self) -> Option<Millis> {
        self.last_move
    }

    /// The one precedence rule between planned and unplanned moves: of `shards`, those an
    /// unplanned failover may start on this round — no move running or settling, and none of
    /// this round's `planned` actions (a planned move hands over losslessly; it goes first).
    pub fn free_for_unplanned<'a>(
        &self,
        shards: impl IntoIterator<Item = &'a str>,
        planned: &[Action],
    ) -> Vec<&'a str> {
        let taken = |s: &str| self.is_busy(s) || planned.iter().any(|a| a.shard == s);
        shards.into_iter().filter(|s| !taken(s)).collect()
    }
}
