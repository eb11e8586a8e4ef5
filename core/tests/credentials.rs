//! The credentials Secret (`credentials::plan`): one table row per situation, and properties of
//! every rotation sequence — re-runs change nothing, promoted passwords were accepted first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use valkey_sidecar_core::credentials::{Refusal, Rotation, Slot, Source, plan};

use Slot::{Agent, Default, NextAgent, NextDefault};

fn secret(entries: &[(Slot, &str)]) -> BTreeMap<Slot, String> {
    entries.iter().map(|(s, v)| (*s, v.to_string())).collect()
}

/// Applies a plan, naming each fresh password after the step that made it.
fn apply(present: &mut BTreeMap<Slot, String>, writes: &[(Slot, Source)], step: usize) {
    let before = present.clone();
    for (slot, source) in writes {
        match source {
            Source::Fresh => {
                present.insert(*slot, format!("fresh-{step}-{slot:?}"));
            }
            Source::From(other) => {
                present.insert(*slot, before[other].clone());
            }
            Source::Removed => {
                present.remove(slot);
            }
        }
    }
}

#[test]
fn table() {
    let current = [(Default, "d"), (Agent, "a")];
    let accepting = [
        (Default, "d"),
        (Agent, "a"),
        (NextDefault, "nd"),
        (NextAgent, "na"),
    ];
    let promoted = [
        (Default, "nd"),
        (Agent, "na"),
        (NextDefault, "nd"),
        (NextAgent, "na"),
    ];
    type Row<'a> = (&'a str, Vec<(Slot, &'a str)>, Rotation, Vec<(Slot, Source)>);
    let rows: Vec<Row> = vec![
        (
            "first install: both passwords made",
            vec![],
            Rotation::None,
            vec![(Default, Source::Fresh), (Agent, Source::Fresh)],
        ),
        ("upgrade: kept", current.to_vec(), Rotation::None, vec![]),
        (
            "one key deleted by hand: only it is made",
            vec![(Default, "d")],
            Rotation::None,
            vec![(Agent, Source::Fresh)],
        ),
        (
            "accept: next passwords made",
            current.to_vec(),
            Rotation::Accept,
            vec![(NextDefault, Source::Fresh), (NextAgent, Source::Fresh)],
        ),
        (
            "accept again: kept",
            accepting.to_vec(),
            Rotation::Accept,
            vec![],
        ),
        (
            "promote: the next become current",
            accepting.to_vec(),
            Rotation::Promote,
            vec![
                (Default, Source::From(NextDefault)),
                (Agent, Source::From(NextAgent)),
            ],
        ),
        (
            "promote again: nothing",
            promoted.to_vec(),
            Rotation::Promote,
            vec![],
        ),
        (
            "accept after promote: nothing new Valkey would not accept",
            promoted.to_vec(),
            Rotation::Accept,
            vec![],
        ),
        (
            "rotation over: the next ones dropped",
            promoted.to_vec(),
            Rotation::None,
            vec![(NextDefault, Source::Removed), (NextAgent, Source::Removed)],
        ),
        (
            "install straight into accept",
            vec![],
            Rotation::Accept,
            vec![
                (Default, Source::Fresh),
                (Agent, Source::Fresh),
                (NextDefault, Source::Fresh),
                (NextAgent, Source::Fresh),
            ],
        ),
    ];
    for (name, present, rotation, want) in rows {
        assert_eq!(plan(&secret(&present), rotation), Ok(want), "{name}");
    }
}

#[test]
fn promote_without_next_passwords_is_refused() {
    for present in [
        vec![],
        vec![(Default, "d"), (Agent, "a")],
        vec![(NextDefault, "x")],
    ] {
        assert_eq!(
            plan(&secret(&present), Rotation::Promote),
            Err(Refusal::NothingToPromote)
        );
    }
    assert!(
        Refusal::NothingToPromote
            .to_string()
            .contains("auth.rotation=accept")
    );
}

#[test]
fn rotation_values_are_the_charts() {
    assert_eq!(Rotation::parse(""), Ok(Rotation::None));
    assert_eq!(Rotation::parse("accept"), Ok(Rotation::Accept));
    assert_eq!(Rotation::parse("promote"), Ok(Rotation::Promote));
    assert!(Rotation::parse("yes").is_err());
}

fn rotation() -> impl Strategy<Value = Rotation> {
    prop_oneof![
        Just(Rotation::None),
        Just(Rotation::Accept),
        Just(Rotation::Promote)
    ]
}

proptest! {
    /// Whatever sequence of upgrades: a re-run of the same step writes nothing (every GitOps
    /// sync re-runs it), the current passwords always exist after a step that was not refused,
    /// and a promoted password is one an `accept` step made before (so the running Valkeys
    /// accepted it after that step's roll).
    #[test]
    fn steps_are_idempotent_and_promote_only_accepted_passwords(
        steps in proptest::collection::vec(rotation(), 1..12)
    ) {
        let mut present = BTreeMap::new();
        let mut accepted: Vec<String> = Vec::new();
        for (i, step) in steps.into_iter().enumerate() {
            let before = present.clone();
            let Ok(writes) = plan(&present, step) else {
                prop_assert_eq!(step, Rotation::Promote);
                continue;
            };
            apply(&mut present, &writes, i);
            prop_assert_eq!(plan(&present, step), Ok(vec![]), "re-run of {:?}", step);
            prop_assert!(present.contains_key(&Default) && present.contains_key(&Agent));
            if step == Rotation::Accept {
                accepted.extend([NextDefault, NextAgent].iter().map(|s| present[s].clone()));
            }
            for slot in [Default, Agent] {
                if before.get(&slot).is_some_and(|b| b != &present[&slot]) {
                    prop_assert!(accepted.contains(&present[&slot]), "{:?} promoted unaccepted", slot);
                }
            }
        }
    }
}
