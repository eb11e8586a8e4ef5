//! Kubeconfig files and clients built from them.
//!
//! The files are JSON (valid YAML, so `kubectl` and kube-rs read them) with the cluster CA inline,
//! so a copy works anywhere on the machine.

use std::path::Path;

use anyhow::Context;
use base64::Engine;
use kube::config::{KubeConfigOptions, Kubeconfig};

use crate::Result;

/// How a kubeconfig authenticates.
#[derive(Clone, Copy, Debug)]
pub enum Credential<'a> {
    /// A bearer token written into the file.
    Token(&'a str),
    /// A file holding the bearer token. kube-rs and client-go re-read it, so the token can be
    /// rotated without touching the kubeconfig (the kubelet does this for pod tokens).
    TokenFile(&'a Path),
}

/// A kubeconfig document for `server` (an `https://` URL) trusting `ca_pem`, as user `user`.
pub fn render(server: &str, ca_pem: &[u8], user: &str, cred: Credential<'_>) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let user_entry = match cred {
        Credential::Token(t) => serde_json::json!({ "token": t }),
        Credential::TokenFile(p) => serde_json::json!({ "tokenFile": p.to_string_lossy() }),
    };
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{ "name": "testkit", "cluster": {
            "server": server,
            "certificate-authority-data": ca,
        }}],
        "users": [{ "name": user, "user": user_entry }],
        "contexts": [{ "name": "testkit", "context": { "cluster": "testkit", "user": user }}],
        "current-context": "testkit",
    });
    // A `Value` always serialises.
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// Writes `contents` to `path` through a temp file and a rename, so a reader never sees half a file.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))
}

/// A client from kubeconfig text (the same code path as a kubeconfig file).
pub async fn client_from_text(text: &str) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::from_yaml(text).context("parsing a generated kubeconfig")?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .context("loading a generated kubeconfig")?;
    // A 429 from the Eviction API is an answer (a budget refuses), not throttling to retry for
    // minutes behind the caller's back.
    config.default_retry = false;
    kube::Client::try_from(config).context("building a kube client")
}
