//! `valkey-sidecar credentials`: makes the chart's auth Secret inside the cluster (a Job the chart
//! renders), so that no render of the chart holds a password: `helm template` under Argo CD or
//! Flux renders the same manifests every time, and the passwords in use are never replaced by new
//! ones. Which passwords to write is `core::credentials::decide`; this adapter reads the Secret,
//! makes random passwords and SHA-256 hashes, and writes it with optimistic concurrency.
//!
//! Exit codes: 0 the Secret is as the release wants it, 1 the rotation step cannot be taken (the
//! message says why), 69 the API could not be had in two minutes, 64 bad usage.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{ArgMatches, Args};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Api;
use kube::api::PostParams;
use ring::rand::{SecureRandom, SystemRandom};
use valkey_sidecar_core::credentials::{Refusal, Rotation, Slot, Source, decide};

use crate::cli::exit;
use crate::k8s::KubeError;

/// Make or update the chart's auth Secret: passwords generated once, in the cluster.
#[derive(Debug, Clone, Args)]
pub struct CredentialsArgs {
    /// The Secret's namespace.
    #[arg(long, short = 'n', env = "POD_NAMESPACE")]
    pub namespace: String,
    /// The Secret.
    #[arg(long)]
    pub secret: String,
    /// A ConfigMap of the release that owns a Secret made here (it goes when the release goes).
    #[arg(long)]
    pub owner: Option<String>,
    /// The rotation step (`auth.rotation`): empty, `accept` or `promote`.
    #[arg(long, default_value = "", value_parser = Rotation::parse)]
    pub rotation: Rotation,
    /// Labels of a Secret made here, `key=value` (repeatable).
    #[arg(long = "label", value_parser = key_value)]
    pub labels: Vec<(String, String)>,
    #[arg(long, default_value = "default-password")]
    pub default_key: String,
    #[arg(long, default_value = "agent-password")]
    pub agent_key: String,
    #[arg(long, default_value = "agent-password-sha256")]
    pub agent_hash_key: String,
    #[arg(long, default_value = "next-default-password")]
    pub next_default_key: String,
    #[arg(long, default_value = "next-agent-password")]
    pub next_agent_key: String,
    #[arg(long, default_value = "next-agent-password-sha256")]
    pub next_agent_hash_key: String,
}

fn key_value(v: &str) -> Result<(String, String), String> {
    v.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("{v:?}: expected key=value"))
}

/// Why the Secret could not be brought where the release wants it.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("{0}")]
    Refused(Refusal),
    #[error(transparent)]
    Kube(#[from] KubeError),
    #[error("no random bytes from the system")]
    Random,
}

impl CredentialsArgs {
    fn key(&self, slot: Slot) -> &str {
        match slot {
            Slot::Default => &self.default_key,
            Slot::Agent => &self.agent_key,
            Slot::NextDefault => &self.next_default_key,
            Slot::NextAgent => &self.next_agent_key,
        }
    }

    /// The hash key that follows a password slot, if any.
    fn hash_key(&self, slot: Slot) -> Option<&str> {
        match slot {
            Slot::Agent => Some(&self.agent_hash_key),
            Slot::NextAgent => Some(&self.next_agent_hash_key),
            Slot::Default | Slot::NextDefault => None,
        }
    }
}

const SLOTS: [Slot; 4] = [
    Slot::Default,
    Slot::Agent,
    Slot::NextDefault,
    Slot::NextAgent,
];

/// `valkey-sidecar credentials`; returns the exit code.
pub fn main(matches: &ArgMatches) -> i32 {
    crate::cli::api_tool("credentials", matches, |args: CredentialsArgs| async move {
        match ensure_with_retries(&args).await {
            Ok(said) => {
                println!("valkey-sidecar credentials: {said}");
                Ok(exit::OK)
            }
            Err(CredentialsError::Refused(r)) => {
                eprintln!("valkey-sidecar credentials: {r}");
                Ok(exit::NO)
            }
            Err(e) => Err(e.to_string()),
        }
    })
}

/// Retries API failures (a conflict with a concurrent run included) for about two minutes.
async fn ensure_with_retries(args: &CredentialsArgs) -> Result<String, CredentialsError> {
    let client = crate::k8s::client().await?;
    let mut delays =
        crate::runtime::retry::exponential(Duration::from_millis(200), Duration::from_secs(10));
    let started = tokio::time::Instant::now();
    loop {
        match ensure(&client, args).await {
            Err(CredentialsError::Kube(e)) if started.elapsed() < Duration::from_secs(120) => {
                let delay = delays.next().unwrap_or(Duration::from_secs(10));
                eprintln!("valkey-sidecar credentials: {e}; again in {delay:?}");
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}

/// One read, plan and write.
async fn ensure(client: &kube::Client, args: &CredentialsArgs) -> Result<String, CredentialsError> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &args.namespace);
    let limit = Duration::from_secs(10);
    let existing = crate::k8s::bounded(limit, secrets.get_opt(&args.secret)).await?;
    let data = existing
        .as_ref()
        .and_then(|s| s.data.clone())
        .unwrap_or_default();
    let present = passwords(args, &data);
    let writes = decide(&present, args.rotation).map_err(CredentialsError::Refused)?;
    let wanted = with_hashes(args, &present, &writes, fresh_password)?;
    let wanted = merged(data.clone(), wanted);
    if existing.is_some() && wanted == data {
        return Ok(format!("{} is as wanted", args.secret));
    }
    let said = describe(args, &writes);
    let params = PostParams::default();
    match existing {
        Some(mut secret) => {
            secret.data = Some(wanted);
            let call = secrets.replace(&args.secret, &params, &secret);
            crate::k8s::bounded(limit, call).await?;
        }
        None => {
            let owner = owner_of(client, args).await?;
            let secret = new_secret(args, wanted, owner);
            let call = secrets.create(&params, &secret);
            crate::k8s::bounded(limit, call).await?;
        }
    }
    Ok(said)
}

/// The passwords in the Secret, by slot (keys that are not UTF-8 count as missing).
fn passwords(
    args: &CredentialsArgs,
    data: &BTreeMap<String, ByteString>,
) -> BTreeMap<Slot, String> {
    SLOTS
        .iter()
        .filter_map(|slot| {
            let value = data.get(args.key(*slot))?;
            Some((*slot, String::from_utf8(value.0.clone()).ok()?))
        })
        .collect()
}

/// What each written key becomes (`None`: removed): the planned passwords and the hashes that
/// follow them.
fn with_hashes(
    args: &CredentialsArgs,
    present: &BTreeMap<Slot, String>,
    writes: &[(Slot, Source)],
    mut fresh: impl FnMut() -> Result<String, CredentialsError>,
) -> Result<BTreeMap<String, Option<String>>, CredentialsError> {
    let mut after = present.clone();
    for (slot, source) in writes {
        match source {
            Source::Fresh => after.insert(*slot, fresh()?),
            Source::From(other) => after.insert(*slot, present[other].clone()),
            Source::Removed => after.remove(slot),
        };
    }
    let mut keys = BTreeMap::new();
    for slot in SLOTS {
        let value = after.get(&slot);
        keys.insert(args.key(slot).to_owned(), value.cloned());
        if let Some(hash_key) = args.hash_key(slot) {
            keys.insert(hash_key.to_owned(), value.map(|v| sha256_hex(v.as_bytes())));
        }
    }
    Ok(keys)
}

/// The Secret's data with the wanted keys set or removed; other keys stay.
fn merged(
    mut data: BTreeMap<String, ByteString>,
    wanted: BTreeMap<String, Option<String>>,
) -> BTreeMap<String, ByteString> {
    for (key, value) in wanted {
        match value {
            Some(v) => data.insert(key, ByteString(v.into_bytes())),
            None => data.remove(&key),
        };
    }
    data
}

fn describe(args: &CredentialsArgs, writes: &[(Slot, Source)]) -> String {
    let parts: Vec<String> = writes
        .iter()
        .map(|(slot, source)| match source {
            Source::Fresh => format!("{} made", args.key(*slot)),
            Source::From(other) => format!("{} from {}", args.key(*slot), args.key(*other)),
            Source::Removed => format!("{} removed", args.key(*slot)),
        })
        .collect();
    if parts.is_empty() {
        format!("{}: hashes brought in line", args.secret)
    } else {
        format!("{}: {}", args.secret, parts.join(", "))
    }
}

/// The release's ConfigMap as the owner of a new Secret; waits a while for it (the chart applies
/// it beside this Job), then makes the Secret without an owner rather than none at all.
async fn owner_of(
    client: &kube::Client,
    args: &CredentialsArgs,
) -> Result<Option<OwnerReference>, KubeError> {
    let Some(name) = &args.owner else {
        return Ok(None);
    };
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &args.namespace);
    for _ in 0..30 {
        let found = crate::k8s::bounded(Duration::from_secs(10), maps.get_opt(name)).await?;
        if let Some(uid) = found.and_then(|m| m.metadata.uid) {
            return Ok(Some(OwnerReference {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                name: name.clone(),
                uid,
                ..OwnerReference::default()
            }));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!("valkey-sidecar credentials: no ConfigMap {name}: the Secret gets no owner");
    Ok(None)
}

fn new_secret(
    args: &CredentialsArgs,
    data: BTreeMap<String, ByteString>,
    owner: Option<OwnerReference>,
) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(args.secret.clone()),
            namespace: Some(args.namespace.clone()),
            labels: Some(args.labels.iter().cloned().collect()),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        type_: Some("Opaque".into()),
        data: Some(data),
        ..Secret::default()
    }
}

/// 32 characters from `[A-Za-z0-9]` (190 bits), without modulo bias.
fn fresh_password() -> Result<String, CredentialsError> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let rng = SystemRandom::new();
    let mut out = String::with_capacity(32);
    while out.len() < 32 {
        let mut byte = [0u8; 1];
        rng.fill(&mut byte).map_err(|_| CredentialsError::Random)?;
        // 248 = 4 × 62: bytes above it would favour the first letters.
        if byte[0] < 248 {
            out.push(char::from(ALPHABET[usize::from(byte[0]) % ALPHABET.len()]));
        }
    }
    Ok(out)
}

/// The SHA-256 of `v` in lowercase hex, as Valkey's ACL `#<hash>` takes it.
pub(crate) fn sha256_hex(v: &[u8]) -> String {
    hex(ring::digest::digest(&ring::digest::SHA256, v).as_ref())
}

/// Lowercase hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: CredentialsArgs,
    }

    fn args(extra: &[&str]) -> CredentialsArgs {
        let mut argv = vec!["x", "--namespace", "ns", "--secret", "v-auth"];
        argv.extend(extra);
        Cli::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn passwords_are_long_alphanumeric_and_distinct() {
        let a = fresh_password().unwrap();
        let b = fresh_password().unwrap();
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_alphanumeric()), "{a}");
        assert_ne!(a, b);
    }

    #[test]
    fn the_hash_is_sha256_hex_as_valkey_takes_it() {
        // printf %s abc | sha256sum
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn a_first_run_writes_both_passwords_and_the_agents_hash() {
        let args = args(&[]);
        let writes = decide(&BTreeMap::new(), Rotation::None).unwrap();
        let mut n = 0;
        let keys = with_hashes(&args, &BTreeMap::new(), &writes, || {
            n += 1;
            Ok(format!("p{n}"))
        })
        .unwrap();
        assert_eq!(keys["default-password"].as_deref(), Some("p1"));
        assert_eq!(keys["agent-password"].as_deref(), Some("p2"));
        assert_eq!(keys["agent-password-sha256"], Some(sha256_hex(b"p2")));
        assert_eq!(keys["next-agent-password-sha256"], None);
    }

    #[test]
    fn merging_keeps_other_keys_and_removes_dropped_ones() {
        let data = BTreeMap::from([
            ("mine".to_owned(), ByteString(b"x".to_vec())),
            (
                "next-default-password".to_owned(),
                ByteString(b"n".to_vec()),
            ),
        ]);
        let wanted = BTreeMap::from([
            ("default-password".to_owned(), Some("d".to_owned())),
            ("next-default-password".to_owned(), None),
        ]);
        let out = merged(data, wanted);
        assert_eq!(out.keys().collect::<Vec<_>>(), ["default-password", "mine"]);
    }

    #[test]
    fn the_rotation_and_labels_are_parsed() {
        let a = args(&["--rotation", "accept", "--label", "a=b"]);
        assert_eq!(a.rotation, Rotation::Accept);
        assert_eq!(a.labels, [("a".to_owned(), "b".to_owned())]);
        assert!(
            Cli::try_parse_from(["x", "-n", "ns", "--secret", "s", "--rotation", "y"]).is_err()
        );
    }
}
