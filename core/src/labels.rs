//! The labels the agent keeps on its own pod, as a pure function of what it knows.
//!
//! The agent applies exactly the map [`desired`] returns with server-side apply under its own
//! field manager: a key missing from the map is a key the agent no longer owns, and the apiserver
//! removes it. That is how the role label disappears — instead of going stale — while the role is
//! unknown.

use std::collections::BTreeMap;

use crate::observation::Role;

/// Label keys and role values, from configuration (operators may want `valkey.io/current-role`,
/// or `master`/`slave` for old tooling).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelPolicy {
    pub role_key: String,
    pub primary_value: String,
    pub replica_value: String,
    pub shard_key: String,
    pub zone_key: String,
    pub region_key: String,
}

impl Default for LabelPolicy {
    fn default() -> Self {
        LabelPolicy {
            role_key: "valkey.io/role".into(),
            primary_value: "primary".into(),
            replica_value: "replica".into(),
            shard_key: "valkey.io/shard-id".into(),
            zone_key: "valkey.io/zone".into(),
            region_key: "valkey.io/region".into(),
        }
    }
}

impl LabelPolicy {
    /// The role a pod's labels claim under this policy (`None`: no role label, or a value of
    /// another policy).
    pub fn role_in(&self, labels: &BTreeMap<String, String>) -> Option<Role> {
        let value = labels.get(&self.role_key)?;
        if *value == self.primary_value {
            Some(Role::Primary)
        } else if *value == self.replica_value {
            Some(Role::Replica)
        } else {
            None
        }
    }
}

/// The role Valkey's answer may be advertised as (the role label, `/primary`): a master counts as
/// primary only with the claim where there is one to check (replication mode: the shard record
/// names it and it renewed in time; `None` in cluster mode, where Valkey's own epochs decide).
pub fn advertised(role: Role, claim: Option<bool>) -> Role {
    match (role, claim) {
        (Role::Primary, Some(false)) => Role::Unknown,
        _ => role,
    }
}

/// What the labels describe.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Facts<'a> {
    pub role: Role,
    pub shard: Option<&'a str>,
    pub zone: Option<&'a str>,
    pub region: Option<&'a str>,
}

/// A value that cannot be a label, reported instead of sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLabel {
    pub key: String,
    pub value: String,
    pub problem: &'static str,
}

/// The labels the agent wants on its pod, and the values it had to drop as invalid.
pub fn desired(
    facts: &Facts<'_>,
    policy: &LabelPolicy,
) -> (BTreeMap<String, String>, Vec<BadLabel>) {
    let role = match facts.role {
        Role::Primary => Some(policy.primary_value.as_str()),
        Role::Replica => Some(policy.replica_value.as_str()),
        Role::Unknown => None,
    };
    let candidates = [
        (&policy.role_key, role),
        (&policy.shard_key, facts.shard),
        (&policy.zone_key, facts.zone),
        (&policy.region_key, facts.region),
    ];
    let mut labels = BTreeMap::new();
    let mut bad = Vec::new();
    for (key, value) in candidates {
        let Some(value) = value else { continue };
        match check_value(value) {
            Ok(()) => {
                labels.insert(key.clone(), value.to_owned());
            }
            Err(problem) => bad.push(BadLabel {
                key: key.clone(),
                value: value.to_owned(),
                problem,
            }),
        }
    }
    (labels, bad)
}

/// A label value as the apiserver validates it: empty, or ≤ 63 characters of `[A-Za-z0-9._-]`
/// starting and ending with an alphanumeric.
pub fn check_value(value: &str) -> Result<(), &'static str> {
    if value.len() > 63 {
        return Err("longer than 63 characters");
    }
    if !value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("characters other than A-Z a-z 0-9 . _ -");
    }
    let alnum_edges = |v: &str| {
        v.starts_with(|c: char| c.is_ascii_alphanumeric())
            && v.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    if !value.is_empty() && !alnum_edges(value) {
        return Err("must start and end with a letter or digit");
    }
    Ok(())
}

/// A label key: optional DNS-subdomain prefix and `/`, then a name like a value (non-empty).
pub fn check_key(key: &str) -> Result<(), &'static str> {
    let (prefix, name) = key.rsplit_once('/').unwrap_or(("", key));
    if name.is_empty() {
        return Err("empty name");
    }
    check_value(name)?;
    let prefix_ok = prefix.len() <= 253
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'));
    if !prefix_ok {
        return Err("prefix must be a lowercase DNS subdomain");
    }
    Ok(())
}

/// Whether the pod's current labels already carry exactly what the agent wants for the keys it
/// manages — if so, nothing is written.
pub fn in_place(
    current: &BTreeMap<String, String>,
    want: &BTreeMap<String, String>,
    policy: &LabelPolicy,
) -> bool {
    let managed = [
        &policy.role_key,
        &policy.shard_key,
        &policy.zone_key,
        &policy.region_key,
    ];
    managed.iter().all(|k| current.get(*k) == want.get(*k))
}

/// Whether the agent must write its labels now.
///
/// `applied` is what the agent last applied successfully (`None` before its first write). Keys the
/// agent wants are compared with the pod; keys it no longer wants are removed only if the agent
/// applied them itself — a label another manager owns would survive the apply, and comparing it
/// again would write forever.
pub fn needs_write(
    current: &BTreeMap<String, String>,
    want: &BTreeMap<String, String>,
    applied: Option<&BTreeMap<String, String>>,
    policy: &LabelPolicy,
) -> bool {
    let missing = want.iter().any(|(k, v)| current.get(k) != Some(v));
    match applied {
        None => !in_place(current, want, policy),
        Some(applied) => missing || applied != want,
    }
}

/// Replication mode: the pods of a shard whose primary label must go because the shard record
/// names another holder. Only the holder may be primary; a pod that still says so after the
/// record moved on — its node powered off or cut off, its agent unable to relabel it — would keep
/// a primary Service and the primaries' budget pointing at it. With no holder on record (never
/// bootstrapped, or released) nothing is judged: who may be primary is not known yet.
///
/// `labelled` is each pod with whether it carries the primary label now.
pub fn stale_primaries<'a>(holder: Option<&str>, labelled: &[(&'a str, bool)]) -> Vec<&'a str> {
    let Some(holder) = holder else {
        return Vec::new();
    };
    labelled
        .iter()
        .filter(|(pod, primary)| *primary && *pod != holder)
        .map(|(pod, _)| *pod)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(role: Role) -> Facts<'static> {
        Facts {
            role,
            shard: Some("8d3f"),
            zone: Some("zone-a"),
            region: None,
        }
    }

    #[test]
    fn role_values_follow_the_policy() {
        let p = LabelPolicy::default();
        let (l, bad) = desired(&facts(Role::Primary), &p);
        assert!(bad.is_empty());
        assert_eq!(l.get("valkey.io/role").map(String::as_str), Some("primary"));
        assert_eq!(
            l.get("valkey.io/shard-id").map(String::as_str),
            Some("8d3f")
        );
        assert_eq!(l.get("valkey.io/zone").map(String::as_str), Some("zone-a"));
        assert!(!l.contains_key("valkey.io/region"));
        let old = LabelPolicy {
            role_key: "role".into(),
            primary_value: "master".into(),
            replica_value: "slave".into(),
            ..p
        };
        let (l, _) = desired(&facts(Role::Replica), &old);
        assert_eq!(l.get("role").map(String::as_str), Some("slave"));
    }

    #[test]
    fn unknown_role_removes_the_label() {
        let (l, _) = desired(&facts(Role::Unknown), &LabelPolicy::default());
        assert!(!l.contains_key("valkey.io/role"));
        assert!(
            l.contains_key("valkey.io/shard-id"),
            "the shard does not change with the role"
        );
    }

    #[test]
    fn invalid_values_are_reported_not_sent() {
        let f = Facts {
            role: Role::Primary,
            shard: Some("shard with spaces"),
            zone: Some(&"z".repeat(64)),
            region: Some("-r"),
        };
        let (l, bad) = desired(&f, &LabelPolicy::default());
        assert_eq!(l.len(), 1);
        let keys: Vec<_> = bad.iter().map(|b| b.key.as_str()).collect();
        assert_eq!(
            keys,
            ["valkey.io/shard-id", "valkey.io/zone", "valkey.io/region"]
        );
    }

    #[test]
    fn keys_validate() {
        assert!(check_key("valkey.io/role").is_ok());
        assert!(check_key("role").is_ok());
        assert!(check_key("Valkey.io/role").is_err());
        assert!(check_key("valkey.io/").is_err());
    }

    #[test]
    fn writes_only_on_change_and_never_loops_on_foreign_labels() {
        let p = LabelPolicy::default();
        let (primary, _) = desired(&facts(Role::Primary), &p);
        let (unknown, _) = desired(&facts(Role::Unknown), &p);
        // Agent restart with correct labels already on the pod: nothing to write.
        assert!(!needs_write(&primary, &primary, None, &p));
        // Role flip: write.
        assert!(needs_write(&primary, &unknown, Some(&primary), &p));
        // After the write, the pod still carries a role label another manager owns: no rewrite.
        assert!(!needs_write(&primary, &unknown, Some(&unknown), &p));
        // Someone removed a label the agent wants: write it back.
        let mut edited = primary.clone();
        edited.remove("valkey.io/zone");
        assert!(needs_write(&edited, &primary, Some(&primary), &p));
    }

    #[test]
    fn in_place_compares_only_managed_keys() {
        let p = LabelPolicy::default();
        let (want, _) = desired(&facts(Role::Primary), &p);
        let mut current = want.clone();
        current.insert("app.kubernetes.io/name".into(), "valkey".into());
        assert!(in_place(&current, &want, &p));
        current.insert("valkey.io/role".into(), "replica".into());
        assert!(!in_place(&current, &want, &p));
        let (unknown, _) = desired(&facts(Role::Unknown), &p);
        assert!(
            !in_place(&current, &unknown, &p),
            "a stale role label must go"
        );
    }

    #[test]
    fn only_the_record_holder_keeps_a_primary_label() {
        let pods = [("a", true), ("b", true), ("c", false)];
        let cases: [(Option<&str>, Vec<&str>); 4] = [
            // The record moved to b: a's label is stale.
            (Some("b"), vec!["a"]),
            // It moved to c, whose agent has not labelled it yet: both labels are stale.
            (Some("c"), vec!["a", "b"]),
            (Some("a"), vec!["b"]),
            // Released or never written: nobody is judged.
            (None, vec![]),
        ];
        for (holder, want) in cases {
            assert_eq!(stale_primaries(holder, &pods), want, "holder {holder:?}");
        }
    }
}
