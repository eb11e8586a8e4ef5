//! `valkey-sidecar credentials`: which passwords the chart's Secret needs written, so that
//! credentials are made once inside the cluster and a render of the chart never holds one (a
//! `helm template` of Argo CD or Flux would invent new ones at every sync). The adapter reads the
//! Secret, asks [`decide`], fills in fresh random passwords and their hashes, and writes the result.
//!
//! A password rotation is three upgrades (`auth.rotation`): `accept` adds the next passwords
//! beside the current ones (Valkey accepts both after a roll), `promote` makes the next ones
//! current (no roll: the agents re-read their password file), `none` drops the next ones (a roll:
//! only the new ones are accepted). Each step is idempotent, so a re-run — every sync of a GitOps
//! tool — changes nothing.

use std::collections::BTreeMap;

/// The four passwords the Secret holds (the agent's hashes follow from them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Slot {
    /// The default user's: clients, and replicas authenticating to their primary.
    Default,
    /// The agent's ACL user's.
    Agent,
    /// During a rotation, the default user's next password.
    NextDefault,
    /// During a rotation, the agent's next password.
    NextAgent,
}

/// The replication user's rights: what a replica sends its primary (the handshake, `PSYNC` or
/// `SYNC`, `REPLCONF` acknowledgements) and nothing else. Its password is in every Valkey
/// container (`masterauth`), so it must not write, flush, re-point or re-configure any node.
pub const REPLICATION_RULES: &str = "resetkeys resetchannels -@all +psync +sync +replconf +ping";

/// The `valkey-settings` container's user: `CONFIG SET` and nothing else (no key, no channel, no
/// other command), so the one right an ACL cannot narrow is held apart from the agent.
pub const SETTINGS_RULES: &str = "resetkeys resetchannels -@all +config|set +client|setinfo";

/// The configuration line of the `valkey-settings` user, whose password has SHA-256 `hash`.
pub fn settings_user_conf(user: &str, hash: &str) -> String {
    format!("user {user} on #{hash} {SETTINGS_RULES}\n")
}

/// How replicas log in to their primary (`auth.replicaLogin`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaLogin {
    /// As the replication user: the Valkey container holds no password that can write.
    Replication,
    /// As the default user, as before the replication user existed: for the one upgrade from
    /// such a release, whose primaries do not know the replication user yet.
    Default,
}

impl ReplicaLogin {
    /// The chart's value: `replication` or `default`.
    pub fn parse(v: &str) -> Result<Self, String> {
        match v {
            "replication" => Ok(ReplicaLogin::Replication),
            "default" => Ok(ReplicaLogin::Default),
            other => Err(format!(
                "{other:?}: replicas log in as `replication` or `default`"
            )),
        }
    }
}

/// What Valkey's authentication settings are made of: the SHA-256 (hex) of each password
/// accepted, current first, and the password replicas log in with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValkeyAuth {
    pub default_hashes: Vec<String>,
    pub replication_user: String,
    pub replication_hashes: Vec<String>,
    pub login: ReplicaLogin,
    /// The password replicas send (`masterauth`), of the user `login` names.
    pub masterauth: Vec<u8>,
}

/// The configuration file Valkey includes (`--include`): the default user and the replication
/// user by their passwords' hashes only, and the login replicas use. Passwords go in quoted with
/// every byte escaped, so no password can end a line or add a directive.
pub fn valkey_auth_conf(auth: &ValkeyAuth) -> String {
    let hashes = |list: &[String]| -> String { list.iter().map(|h| format!(" #{h}")).collect() };
    let user = match auth.login {
        ReplicaLogin::Replication => auth.replication_user.as_str(),
        ReplicaLogin::Default => "default",
    };
    format!(
        "user default on{} ~* &* +@all\nuser {} on{} {REPLICATION_RULES}\nmasteruser {user}\nmasterauth {}\n",
        hashes(&auth.default_hashes),
        auth.replication_user,
        hashes(&auth.replication_hashes),
        quoted(&auth.masterauth),
    )
}

/// A Valkey configuration argument holding any bytes: `"\xHH…"`.
fn quoted(bytes: &[u8]) -> String {
    let escaped: String = bytes.iter().map(|b| format!("\\x{b:02x}")).collect();
    format!("\"{escaped}\"")
}

/// Whether `name` can be a Valkey ACL user of the chart's: one configuration word, not the
/// default user.
pub fn valid_user_name(name: &str) -> bool {
    !name.is_empty()
        && name != "default"
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The step of a password rotation the release is at (`auth.rotation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    /// No rotation: the current passwords only.
    None,
    /// Valkey accepts the next passwords beside the current ones.
    Accept,
    /// The next passwords become the current ones.
    Promote,
}

impl Rotation {
    /// The chart's value: `""`, `accept` or `promote`.
    pub fn parse(v: &str) -> Result<Self, String> {
        match v {
            "" | "none" => Ok(Rotation::None),
            "accept" => Ok(Rotation::Accept),
            "promote" => Ok(Rotation::Promote),
            other => Err(format!(
                "{other:?}: the rotation is `accept`, `promote` or empty"
            )),
        }
    }
}

/// What one slot gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// A fresh random password.
    Fresh,
    /// The password now in another slot.
    From(Slot),
    /// Nothing: the slot is removed.
    Removed,
}

/// Why the Secret cannot be brought where the release wants it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// `promote` without next passwords would make passwords nobody accepts the current ones.
    NothingToPromote,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::NothingToPromote => f.write_str(
                "auth.rotation=promote: the Secret holds no next passwords (nothing Valkey \
                 accepts yet); upgrade with auth.rotation=accept first",
            ),
        }
    }
}

/// The writes that bring the Secret's passwords (`present`, by slot) where `rotation` wants
/// them; empty when it is there already.
pub fn decide(
    present: &BTreeMap<Slot, String>,
    rotation: Rotation,
) -> Result<Vec<(Slot, Source)>, Refusal> {
    let mut writes = Vec::new();
    let missing = |slot| !present.contains_key(&slot);
    if rotation == Rotation::Promote {
        if missing(Slot::NextDefault) || missing(Slot::NextAgent) {
            return Err(Refusal::NothingToPromote);
        }
        for (current, next) in [
            (Slot::Default, Slot::NextDefault),
            (Slot::Agent, Slot::NextAgent),
        ] {
            if present.get(&current) != present.get(&next) {
                writes.push((current, Source::From(next)));
            }
        }
        return Ok(writes);
    }
    for slot in [Slot::Default, Slot::Agent] {
        if missing(slot) {
            writes.push((slot, Source::Fresh));
        }
    }
    for slot in [Slot::NextDefault, Slot::NextAgent] {
        match rotation {
            // Only when missing: a re-run of `accept` after `promote` (without the `none` step)
            // must not make next passwords the running Valkeys never accepted.
            Rotation::Accept if missing(slot) => writes.push((slot, Source::Fresh)),
            Rotation::None if !missing(slot) => writes.push((slot, Source::Removed)),
            _ => {}
        }
    }
    Ok(writes)
}
