//! `valkey-sidecar valkey-config` (formerly `valkey-auth`, still accepted): the chart's init
//! container that writes the file Valkey includes (`--include`) into a memory-backed volume shared
//! with Valkey. Two parts, each only when asked for:
//! - authentication, so that the Valkey container never holds a password that can write: it reads
//!   the default user's passwords from a Secret volume only it mounts, and writes their SHA-256,
//!   the replication user (derived password, `core::credentials::REPLICATION_RULES`) and the
//!   replicas' login;
//! - `maxmemory`, a share of the Valkey container's memory limit (`core::memory`), which the
//!   downward API hands in: a Valkey argument cannot compute a share, and the limit is what the
//!   pod really got (a LimitRange or a resize included), not what the chart asked for.
//!
//! The replication password is derived from the default one (HMAC-SHA256), so an existing Secret
//! needs no new key and a rotation of the default password rotates it too; it cannot be turned
//! back into the default password.
//!
//! Exit codes: 0 written, 64 bad usage (a bad limit or share too), 66 no default password, 74 the
//! file could not be written.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clap::{ArgMatches, Args, FromArgMatches};
use valkey_sidecar_core::credentials::{
    ReplicaLogin, ValkeyAuth, settings_user_conf, valid_user_name, valkey_auth_conf,
};
use valkey_sidecar_core::memory;

use crate::cli::exit;
use crate::commands::credentials::{hex, sha256_hex};

/// `valkey-sidecar valkey-config`.
#[derive(Debug, Args)]
pub struct ValkeyConfigArgs {
    /// A directory with the default user's password in `default` and, during a rotation, the
    /// next one in `next-default` (a Secret volume). Without it: no authentication lines.
    #[arg(long)]
    pub passwords: Option<PathBuf>,
    /// The Valkey container's memory limit in bytes (the downward API's `limits.memory`).
    /// Without it: no `maxmemory` line.
    #[arg(long)]
    pub memory_limit: Option<String>,
    /// The share of the memory limit Valkey's `maxmemory` gets, in percent (10 to 95).
    #[arg(long, default_value_t = memory::DEFAULT_PERCENT)]
    pub maxmemory_percent: u8,
    /// The file to write (in a volume the Valkey container mounts).
    #[arg(long)]
    pub out: PathBuf,
    /// The replication user's name.
    #[arg(long, default_value = "valkey-replication")]
    pub replication_user: String,
    /// Which user replicas log in as: `replication`, or `default` for the one upgrade from a
    /// release whose primaries do not know the replication user yet.
    #[arg(long, default_value = "replication", value_parser = ReplicaLogin::parse)]
    pub replica_login: ReplicaLogin,
    /// The `valkey-settings` container's user (`CONFIG SET` only), with a password made afresh
    /// for this pod and written to `--settings-password`. Only with `--passwords`.
    #[arg(long, requires = "settings_password")]
    pub settings_user: Option<String>,
    /// Where the settings user's password goes (a volume only Valkey and the settings container
    /// mount).
    #[arg(long, requires = "settings_user")]
    pub settings_password: Option<PathBuf>,
}

/// Why the file was not written.
#[derive(Debug, thiserror::Error)]
pub enum ValkeyConfigError {
    #[error("{0}: {1}")]
    NoPassword(PathBuf, std::io::Error),
    #[error("--replication-user {0:?}: letters, digits, `.`, `_` and `-` only, not `default`")]
    UserName(String),
    #[error(
        "--settings-user {0:?}: letters, digits, `.`, `_` and `-` only, not `default` nor the replication user"
    )]
    SettingsUser(String),
    #[error("no system randomness for the settings user's password")]
    Random,
    #[error("--memory-limit: {0}")]
    MemoryLimit(String),
    #[error("--maxmemory-percent {0}: between 10 and 95")]
    Percent(u8),
    #[error("{0}: {1}")]
    Write(PathBuf, std::io::Error),
}

impl ValkeyConfigError {
    fn code(&self) -> i32 {
        match self {
            ValkeyConfigError::NoPassword(..) => exit::NO_INPUT,
            ValkeyConfigError::UserName(_)
            | ValkeyConfigError::SettingsUser(_)
            | ValkeyConfigError::MemoryLimit(_)
            | ValkeyConfigError::Percent(_) => exit::CONFIG,
            ValkeyConfigError::Write(..) => exit::IO,
            ValkeyConfigError::Random => exit::SOFTWARE,
        }
    }
}

/// `valkey-sidecar valkey-config`; returns the exit code.
pub fn main(matches: &ArgMatches) -> i32 {
    let args = match ValkeyConfigArgs::from_arg_matches(matches) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("valkey-sidecar valkey-config: {e}");
            return exit::CONFIG;
        }
    };
    match write(&args) {
        Ok(()) => exit::OK,
        Err(e) => {
            eprintln!("valkey-sidecar valkey-config: {e}");
            e.code()
        }
    }
}

/// Everything is checked and read before anything is written: a bad argument leaves no file.
fn write(args: &ValkeyConfigArgs) -> Result<(), ValkeyConfigError> {
    let mut conf = auth_conf(args)?;
    conf.push_str(&memory_conf(args)?);
    let settings = settings_user(args)?;
    if let Some((path, password, line)) = &settings {
        conf.push_str(line);
        write_private(path, password.as_bytes())
            .map_err(|e| ValkeyConfigError::Write(path.clone(), e))?;
    }
    write_private(&args.out, conf.as_bytes())
        .map_err(|e| ValkeyConfigError::Write(args.out.clone(), e))
}

/// The settings user's password file, password and configuration line, when asked for. The
/// password is new on every start of the pod and never leaves it: nothing outside the pod needs
/// it, so there is nothing to rotate.
fn settings_user(
    args: &ValkeyConfigArgs,
) -> Result<Option<(PathBuf, String, String)>, ValkeyConfigError> {
    let (Some(user), Some(path), Some(_)) = (
        &args.settings_user,
        &args.settings_password,
        &args.passwords,
    ) else {
        return Ok(None);
    };
    if !valid_user_name(user) || *user == args.replication_user {
        return Err(ValkeyConfigError::SettingsUser(user.clone()));
    }
    let password = random_password()?;
    let line = settings_user_conf(user, &sha256_hex(password.as_bytes()));
    Ok(Some((path.clone(), password, line)))
}

/// 32 random bytes, hex.
fn random_password() -> Result<String, ValkeyConfigError> {
    use ring::rand::SecureRandom;
    let mut bytes = [0u8; 32];
    ring::rand::SystemRandom::new()
        .fill(&mut bytes)
        .map_err(|_| ValkeyConfigError::Random)?;
    Ok(hex(&bytes))
}

fn auth_conf(args: &ValkeyConfigArgs) -> Result<String, ValkeyConfigError> {
    let Some(dir) = &args.passwords else {
        return Ok(String::new());
    };
    if !valid_user_name(&args.replication_user) {
        return Err(ValkeyConfigError::UserName(args.replication_user.clone()));
    }
    let current = read(&dir.join("default"))?;
    let next = read_optional(&dir.join("next-default"))?;
    Ok(valkey_auth_conf(&settings(args, &current, next.as_deref())))
}

fn memory_conf(args: &ValkeyConfigArgs) -> Result<String, ValkeyConfigError> {
    let percent = args.maxmemory_percent;
    if !memory::PERCENT_RANGE.contains(&percent) {
        return Err(ValkeyConfigError::Percent(percent));
    }
    let Some(text) = &args.memory_limit else {
        return Ok(String::new());
    };
    let limit = memory::parse_limit(text).map_err(ValkeyConfigError::MemoryLimit)?;
    Ok(memory::maxmemory_conf(memory::maxmemory(limit, percent)))
}

/// The settings from the current (and next) default password. Bytes as the Secret holds them:
/// the hash must match what clients send, trailing newline included.
fn settings(args: &ValkeyConfigArgs, current: &[u8], next: Option<&[u8]>) -> ValkeyAuth {
    let passwords: Vec<&[u8]> = std::iter::once(current).chain(next).collect();
    let masterauth = match args.replica_login {
        ReplicaLogin::Replication => replication_password(current).into_bytes(),
        ReplicaLogin::Default => current.to_vec(),
    };
    ValkeyAuth {
        default_hashes: passwords.iter().map(|p| sha256_hex(p)).collect(),
        replication_user: args.replication_user.clone(),
        replication_hashes: passwords
            .iter()
            .map(|p| sha256_hex(replication_password(p).as_bytes()))
            .collect(),
        login: args.replica_login,
        masterauth,
    }
}

/// The replication user's password: HMAC-SHA256 of a fixed label under the default password.
pub fn replication_password(default_password: &[u8]) -> String {
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, default_password);
    hex(ring::hmac::sign(&key, b"valkey-sidecar replication user").as_ref())
}

fn read(path: &Path) -> Result<Vec<u8>, ValkeyConfigError> {
    std::fs::read(path).map_err(|e| ValkeyConfigError::NoPassword(path.to_owned(), e))
}

fn read_optional(path: &Path) -> Result<Option<Vec<u8>>, ValkeyConfigError> {
    match std::fs::read(path) {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(ValkeyConfigError::NoPassword(path.to_owned(), e)),
    }
}

/// Written under a temporary name, then renamed: Valkey never reads half a file. Readable by the
/// owner and the pod's group only (Valkey may run as another user in the pod's fsGroup); set
/// again after writing because the umask narrows the mode given at creation.
fn write_private(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let partial = path.with_extension("partial");
    // A partial file left by an interrupted run is read-only: open would refuse it.
    match std::fs::remove_file(&partial) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o440)
        .open(&partial)?;
    file.write_all(contents)?;
    file.sync_all()?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o440))?;
    std::fs::rename(&partial, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ValkeyConfigArgs,
    }

    fn args(extra: &[&str]) -> ValkeyConfigArgs {
        let mut argv = vec!["x", "--passwords", "/p", "--out", "/o"];
        argv.extend(extra);
        Cli::try_parse_from(argv).unwrap().args
    }

    #[test]
    fn the_replication_password_is_derived_and_is_not_the_default_one() {
        let a = replication_password(b"secret");
        assert_eq!(a, replication_password(b"secret"));
        assert_ne!(a, replication_password(b"secret2"));
        assert_eq!(a.len(), 64);
        assert!(!a.contains("secret"));
    }

    #[test]
    fn replicas_log_in_as_the_replication_user_with_the_derived_password() {
        let auth = settings(&args(&[]), b"pw", None);
        assert_eq!(auth.default_hashes, [sha256_hex(b"pw")]);
        assert_eq!(auth.masterauth, replication_password(b"pw").into_bytes());
        let conf = valkey_auth_conf(&auth);
        assert!(!conf.contains("pw\""), "{conf}");
        assert!(conf.contains("masteruser valkey-replication\n"), "{conf}");
    }

    #[test]
    fn a_rotation_accepts_both_generations_and_logs_in_with_the_current() {
        let auth = settings(&args(&["--replica-login", "default"]), b"old", Some(b"new"));
        assert_eq!(
            auth.default_hashes,
            [sha256_hex(b"old"), sha256_hex(b"new")]
        );
        assert_eq!(auth.replication_hashes.len(), 2);
        assert_eq!(auth.masterauth, b"old");
    }

    #[test]
    fn the_file_is_written_private_and_a_missing_password_is_an_error() {
        let dir = std::env::temp_dir().join(format!("vs-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut a = args(&[]);
        a.passwords = Some(dir.clone());
        a.out = dir.join("auth.conf");
        assert_eq!(write(&a).unwrap_err().code(), exit::NO_INPUT);
        std::fs::write(dir.join("default"), "pw").unwrap();
        write(&a).unwrap();
        let mode = std::fs::metadata(&a.out).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o440);
        a.replication_user = "default".into();
        assert_eq!(write(&a).unwrap_err().code(), exit::CONFIG);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_settings_user_gets_a_fresh_password_and_config_set_only() {
        let dir = std::env::temp_dir().join(format!("vs-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("default"), "pw").unwrap();
        let password = dir.join("settings.password");
        let flags = ["--settings-user", "valkey-settings", "--settings-password"];
        let mut a = args(&[&flags[..], &[password.to_str().unwrap()]].concat());
        a.passwords = Some(dir.clone());
        a.out = dir.join("valkey.conf");
        write(&a).unwrap();
        let first = std::fs::read_to_string(&password).unwrap();
        let conf = std::fs::read_to_string(&a.out).unwrap();
        let line = format!("user valkey-settings on #{} ", sha256_hex(first.as_bytes()));
        assert!(conf.contains(&line), "{conf}");
        assert!(
            conf.contains("-@all +config|set +client|setinfo\n"),
            "{conf}"
        );
        assert!(!conf.contains(&first), "only the hash: {conf}");
        write(&a).unwrap();
        assert_ne!(std::fs::read_to_string(&password).unwrap(), first);
        a.settings_user = Some("valkey-replication".into());
        assert_eq!(write(&a).unwrap_err().code(), exit::CONFIG);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn maxmemory_is_a_share_of_the_limit_and_a_bad_limit_writes_nothing() {
        let dir = std::env::temp_dir().join(format!("vs-memory-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("valkey.conf");
        let mut a = args(&["--memory-limit", "268435456", "--maxmemory-percent", "50"]);
        a.passwords = None;
        a.out = out.clone();
        write(&a).unwrap();
        let conf = std::fs::read_to_string(&out).unwrap();
        assert_eq!(conf, "maxmemory 134217728\n");
        std::fs::remove_file(&out).unwrap();
        for bad in [["--memory-limit", "256Mi"], ["--maxmemory-percent", "99"]] {
            let mut a = args(&bad);
            a.passwords = None;
            a.out = out.clone();
            assert_eq!(write(&a).unwrap_err().code(), exit::CONFIG, "{bad:?}");
            assert!(!out.exists());
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
