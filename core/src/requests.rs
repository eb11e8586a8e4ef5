//! What an operator asks of the coordinator (`valkey-sidecar pause | resume | switchover`): requests
//! written as annotations on the coordinator Lease, which the holder reads with the renewals it
//! makes anyway, and answers in its status annotations.
//!
//! Only the Lease holder acts on a request, so one actor still moves primaries. The holder carries
//! a request on in every write it makes (its writes replace the whole object), and drops a
//! switchover request once it has answered it: the answer (`status.valkey.io/switchover`) names
//! the request's id, which is how the CLI knows its own answer from an older one.

use std::collections::BTreeSet;
use std::fmt;

use crate::plan::{
    Action, Ask, Kind, Member, Policy, Shards, candidates, eligible, preferred_zone,
};

/// Present while the coordinator is paused; the value says since when, by whom and why.
pub const PAUSED: &str = "valkey.io/paused";
/// A pending switchover request ([`SwitchoverRequest`]).
pub const SWITCHOVER: &str = "valkey.io/switchover";
/// The holder's answer to the last switchover request ([`SwitchoverAnswer`]).
pub const ANSWER: &str = "status.valkey.io/switchover";

/// The longest request value read: a request is a few words, anything longer is not one of ours.
const MAX_LEN: usize = 512;

/// A planned hand-over an operator asked for: make a replica of shard `shard` (the pods'
/// `valkey.io/shard-index`) the primary — `to`, or the best synced replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchoverRequest {
    pub id: String,
    pub shard: String,
    pub to: Option<String>,
}

/// Why a request value could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadRequest(pub String);

impl fmt::Display for BadRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl SwitchoverRequest {
    /// `id=<id> shard=<n>[ to=<pod>]`.
    pub fn render(&self) -> String {
        let mut out = format!("id={} shard={}", self.id, self.shard);
        if let Some(to) = &self.to {
            out.push_str(&format!(" to={to}"));
        }
        out
    }

    /// Reads [`render`](Self::render)'s form; an id and a shard are required, the words may come
    /// in any order, an unknown word is an error (a newer CLI's request is not half-understood).
    pub fn parse(value: &str) -> Result<SwitchoverRequest, BadRequest> {
        if value.len() > MAX_LEN {
            return Err(BadRequest(format!("longer than {MAX_LEN} bytes")));
        }
        let (mut id, mut shard, mut to) = (None, None, None);
        for word in value.split_whitespace() {
            let slot = match word.split_once('=') {
                Some(("id", v)) => (&mut id, v),
                Some(("shard", v)) => (&mut shard, v),
                Some(("to", v)) => (&mut to, v),
                _ => return Err(BadRequest(format!("unknown word {word:?}"))),
            };
            set_once(slot, word)?;
        }
        match (id, shard) {
            (Some(id), Some(shard)) => Ok(SwitchoverRequest { id, shard, to }),
            _ => Err(BadRequest("an id and a shard are required".into())),
        }
    }
}

fn set_once((slot, value): (&mut Option<String>, &str), word: &str) -> Result<(), BadRequest> {
    if value.is_empty() || slot.is_some() {
        return Err(BadRequest(format!("empty or repeated word {word:?}")));
    }
    *slot = Some(value.to_owned());
    Ok(())
}

/// How a switchover request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The new primary is in place.
    Done,
    /// Not attempted: it would have been unsafe or impossible (no synced replica, …).
    Refused,
    /// Attempted and given up; the primary is unchanged or the move's end is unknown.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Done => "done",
            Outcome::Refused => "refused",
            Outcome::Failed => "failed",
        }
    }

    fn parse(word: &str) -> Option<Outcome> {
        [Outcome::Done, Outcome::Refused, Outcome::Failed]
            .into_iter()
            .find(|o| o.as_str() == word)
    }
}

/// The holder's answer to one request: `<id> <outcome>: <message>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchoverAnswer {
    pub id: String,
    pub outcome: Outcome,
    pub message: String,
}

impl SwitchoverAnswer {
    pub fn render(&self) -> String {
        format!("{} {}: {}", self.id, self.outcome.as_str(), self.message)
    }

    pub fn parse(value: &str) -> Option<SwitchoverAnswer> {
        let (head, message) = value.split_once(": ")?;
        let (id, outcome) = head.split_once(' ')?;
        Some(SwitchoverAnswer {
            id: id.to_owned(),
            outcome: Outcome::parse(outcome)?,
            message: message.to_owned(),
        })
    }
}

/// The requests the holder found on the Lease.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Requests {
    /// The pause annotation's value while paused.
    pub paused: Option<String>,
    /// A pending switchover, or why its value could not be read.
    pub switchover: Option<Result<SwitchoverRequest, BadRequest>>,
}

impl Requests {
    /// From the Lease's annotations (`get` looks one up).
    pub fn from_annotations<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Requests {
        Requests {
            paused: get(PAUSED).map(str::to_owned),
            switchover: get(SWITCHOVER).map(SwitchoverRequest::parse),
        }
    }
}

/// The planner's answer to a switchover asked for: the move, nothing yet (its shard is busy with
/// another move: asked again next round), or why it will not be made. The target is `to` when
/// named, else the best candidate of a planned hand-over (highest offset, preferred zone); either
/// must be a synced replica on a usable node, so the move loses no acknowledged write.
pub fn answer(
    s: &Shards<'_>,
    policy: &Policy,
    ask: &Ask,
    busy: &BTreeSet<&str>,
) -> Result<Option<Action>, String> {
    let n = &ask.shard;
    let shard = shard_of(s, ask).ok_or_else(|| format!("no Valkey of shard {n} is known"))?;
    if busy.contains(shard) {
        return Ok(None);
    }
    let primary = s
        .primary(shard)
        .ok_or_else(|| format!("shard {n} has no live primary"))?;
    let to = match &ask.to {
        Some(pod) => named(s, shard, pod, n)?,
        None => {
            let zone = preferred_zone(s, policy, shard);
            let best = candidates(s, shard, zone).into_iter().next();
            best.ok_or_else(|| format!("shard {n}: no synced replica can take over"))?
        }
    };
    Ok(Some(Action {
        kind: Kind::Switchover,
        shard: shard.to_owned(),
        from: primary.id.clone(),
        to: to.id.clone(),
        reason: format!("asked for (request {})", ask.id),
    }))
}

/// The planner's shard of the asked shard's pods.
fn shard_of<'a>(s: &Shards<'a>, ask: &Ask) -> Option<&'a str> {
    s.world
        .members
        .iter()
        .find(|m| m.pod.as_ref().is_some_and(|p| ask.pods.contains(&p.name)))
        .map(|m| m.shard.as_str())
}

/// The named pod, if it may become the shard's primary now.
fn named<'a>(s: &Shards<'a>, shard: &str, pod: &str, n: &str) -> Result<&'a Member, String> {
    let is_pod = |m: &&Member| m.pod.as_ref().is_some_and(|p| p.name == pod);
    let m = s
        .members(shard)
        .find(is_pod)
        .ok_or_else(|| format!("pod {pod} is not a member of shard {n}"))?;
    if m.is_live_primary() {
        return Err(format!("pod {pod} is the primary of shard {n} already"));
    }
    if !eligible(s.world, m) {
        return Err(format!(
            "pod {pod} is not a synced replica on a usable node, so it could lose writes"
        ));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(id: &str, shard: &str, to: Option<&str>) -> SwitchoverRequest {
        SwitchoverRequest {
            id: id.into(),
            shard: shard.into(),
            to: to.map(Into::into),
        }
    }

    #[test]
    fn a_request_reads_back_what_was_rendered() {
        for r in [req("a1", "0", None), req("x", "12", Some("orders-12-2"))] {
            assert_eq!(SwitchoverRequest::parse(&r.render()), Ok(r));
        }
        assert_eq!(
            SwitchoverRequest::parse("to=p shard=1  id=z"),
            Ok(req("z", "1", Some("p")))
        );
    }

    #[test]
    fn a_request_missing_a_word_or_with_an_unknown_one_is_refused() {
        let bad = [
            "",
            "id=1",
            "shard=1",
            "id=1 shard=1 by=me",
            "id=1 id=2 shard=1",
            "id= shard=1",
            "id=1 shard=1 to",
        ];
        for value in bad {
            assert!(SwitchoverRequest::parse(value).is_err(), "{value:?}");
        }
        let long = format!("id=1 shard=1 to={}", "p".repeat(600));
        assert!(SwitchoverRequest::parse(&long).is_err());
    }

    #[test]
    fn an_answer_reads_back_what_was_rendered() {
        for outcome in [Outcome::Done, Outcome::Refused, Outcome::Failed] {
            let a = SwitchoverAnswer {
                id: "k7".into(),
                outcome,
                message: "shard 0: a → b: in 50 ms".into(),
            };
            assert_eq!(SwitchoverAnswer::parse(&a.render()), Some(a));
        }
        assert_eq!(SwitchoverAnswer::parse("k7 maybe: x"), None);
        assert_eq!(SwitchoverAnswer::parse("garbage"), None);
    }

    #[test]
    fn requests_come_from_the_annotations() {
        let got = Requests::from_annotations(|k| match k {
            PAUSED => Some("since now"),
            SWITCHOVER => Some("id=1 shard=2"),
            _ => None,
        });
        assert_eq!(got.paused.as_deref(), Some("since now"));
        assert_eq!(got.switchover, Some(Ok(req("1", "2", None))));
        assert_eq!(Requests::from_annotations(|_| None), Requests::default());
    }
}
