//! Locating the Kubernetes binaries and the agent binary.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use anyhow::{Context, anyhow};

use crate::Result;

/// A directory holding `etcd`, `kube-apiserver`, `kube-scheduler`, `kube-controller-manager` and
/// `kubectl`; bypasses `scripts/k8s-bins.sh`.
pub const K8S_BIN_DIR_ENV: &str = "VALKEY_TESTKIT_K8S_BIN_DIR";

/// Path of the `valkey-sidecar` binary the process-backed pods run.
pub const SIDECAR_BIN_ENV: &str = "VALKEY_SIDECAR_BIN";

/// The directory with the control-plane binaries: `$VALKEY_TESTKIT_K8S_BIN_DIR`, else what
/// `scripts/k8s-bins.sh` prints (it builds Kubernetes v1.37.2 and etcd v3.6.16 from Go modules into
/// `~/.cache/valkey-sidecar` on first use, which takes many minutes; later calls are instant).
///
/// Blocking; looked up once per process.
pub fn k8s_bin_dir() -> Result<PathBuf> {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| find_bin_dir().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!(e))
}

/// The `kubectl` of the default release (a plane's own: [`super::ControlPlane::kubectl`]).
pub fn kubectl_bin() -> Result<PathBuf> {
    Ok(k8s_bin_dir()?.join("kubectl"))
}

/// The control-plane binaries of another pinned Kubernetes minor (`"1.30"`):
/// `$VALKEY_TESTKIT_K8S_BIN_DIR_1_30`, else what `K8S_VERSION=1.30 scripts/k8s-bins.sh` prints
/// (built on first use like the default's). `None`: the default release ([`k8s_bin_dir`]).
///
/// Blocking; looked up once per version and process.
pub fn k8s_bin_dir_for(minor: Option<&str>) -> Result<PathBuf> {
    static DIRS: OnceLock<Mutex<BTreeMap<String, Result<PathBuf, String>>>> = OnceLock::new();
    let Some(minor) = minor else {
        return k8s_bin_dir();
    };
    let dirs = DIRS.get_or_init(Default::default);
    let mut dirs = dirs.lock().unwrap_or_else(|e| e.into_inner());
    dirs.entry(minor.to_owned())
        .or_insert_with(|| find_version_dir(minor).map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!(e))
}

/// The variable that points at the binaries of `minor` (`1.30` → `..._BIN_DIR_1_30`).
pub fn k8s_bin_dir_env(minor: &str) -> String {
    format!("{K8S_BIN_DIR_ENV}_{}", minor.replace('.', "_"))
}

fn find_version_dir(minor: &str) -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(k8s_bin_dir_env(minor)) {
        return Ok(PathBuf::from(dir));
    }
    crate::binaries::path_from_script_with("k8s-bins.sh", &[("K8S_VERSION", minor)])
}

fn find_bin_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os(K8S_BIN_DIR_ENV) {
        return Ok(PathBuf::from(dir));
    }
    crate::binaries::path_from_script("k8s-bins.sh")
}

/// The `valkey-sidecar` binary: `$VALKEY_SIDECAR_BIN`, else the one cargo built next to the running
/// executable. A test binary lives in `target/<profile>/deps/` and `cargo test --workspace` puts
/// the workspace's binaries in `target/<profile>/`; the demo binary sits in `target/<profile>/`
/// itself. With `cargo test -p valkey-sidecar-testkit` alone the agent may be missing or stale:
/// run `cargo build --bin valkey-sidecar` first or set the variable.
pub fn sidecar_bin() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os(SIDECAR_BIN_ENV) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("locating the running executable")?;
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|dir| dir.join("valkey-sidecar"))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "no valkey-sidecar binary next to {}: run `cargo build --bin valkey-sidecar` or \
                 set {SIDECAR_BIN_ENV}",
                exe.display()
            )
        })
}
