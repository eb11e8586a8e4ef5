//! The credentials Secret (`credentials::decide`): one table row per situation, and properties of
//! every rotation sequence — re-runs change nothing, promoted passwords were accepted first; the
//! authentication file Valkey includes (`credentials::valkey_auth_conf`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use proptest::prelude::*;
use valkey_sidecar_core::credentials::{
    Refusal, ReplicaLogin, Rotation, Slot, Source, ValkeyAuth, decide, valid_user_name,
    valkey_auth_conf,
};

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
        assert_eq!(decide(&secret(&present), rotation), Ok(want), "{name}");
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
            decide(&secret(&present), Rotation::Promote),
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
            let Ok(writes) = decide(&present, step) else {
                prop_assert_eq!(step, Rotation::Promote);
                continue;
            };
            apply(&mut present, &writes, i);
            prop_assert_eq!(decide(&present, step), Ok(vec![]), "re-run of {:?}", step);
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

fn auth(login: ReplicaLogin, masterauth: Vec<u8>) -> ValkeyAuth {
    ValkeyAuth {
        default_hashes: vec!["aa".into(), "bb".into()],
        replication_user: "valkey-replication".into(),
        replication_hashes: vec!["cc".into()],
        login,
        masterauth,
    }
}

/// The file Valkey includes: the default user by hashes with every right, the replication user
/// with replication only, and the login replicas use.
#[test]
fn valkey_auth_conf_names_hashes_only_and_the_replicas_login() {
    let conf = valkey_auth_conf(&auth(ReplicaLogin::Replication, b"pw".to_vec()));
    let lines: Vec<&str> = conf.lines().collect();
    assert_eq!(
        lines,
        [
            "user default on #aa #bb ~* &* +@all",
            "user valkey-replication on #cc resetkeys resetchannels -@all +psync +sync +replconf +ping",
            "masteruser valkey-replication",
            "masterauth \"\\x70\\x77\"",
        ]
    );
    let upgrade = valkey_auth_conf(&auth(ReplicaLogin::Default, b"pw".to_vec()));
    assert!(upgrade.contains("\nmasteruser default\n"), "{upgrade}");
    assert!(
        upgrade.contains("user valkey-replication on #cc"),
        "{upgrade}"
    );
}

#[test]
fn user_names_are_one_word_and_never_default() {
    for (name, valid) in [
        ("valkey-replication", true),
        ("repl_1.a", true),
        ("default", false),
        ("", false),
        ("a b", false),
        ("a\nmasteruser x", false),
        ("\"x\"", false),
    ] {
        assert_eq!(valid_user_name(name), valid, "{name:?}");
    }
}

/// The inverse of the file's quoting, as Valkey's config parser reads `"\xHH…"`.
fn unquote(arg: &str) -> Option<Vec<u8>> {
    let inner = arg.strip_prefix('"')?.strip_suffix('"')?;
    inner
        .split("\\x")
        .skip(1)
        .map(|h| u8::from_str_radix(h, 16).ok())
        .collect()
}

proptest! {
    /// No password, whatever its bytes (newlines, quotes, spaces, NULs), adds a line or a
    /// directive to the file, and Valkey reads back exactly the password.
    #[test]
    fn no_password_can_add_a_directive(masterauth in proptest::collection::vec(any::<u8>(), 0..64)) {
        let conf = valkey_auth_conf(&auth(ReplicaLogin::Default, masterauth.clone()));
        let lines: Vec<&str> = conf.lines().collect();
        prop_assert_eq!(lines.len(), 4);
        let (key, value) = lines[3].split_once(' ').unwrap();
        prop_assert_eq!(key, "masterauth");
        prop_assert_eq!(unquote(value), Some(masterauth));
    }
}
