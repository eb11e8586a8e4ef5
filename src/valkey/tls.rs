//! TLS to Valkey with rustls (ring provider; no OpenSSL, so the binary stays static).
//!
//! The agent does TLS itself instead of through the client library so that the name verified in
//! Valkey's certificate can differ from the address dialled: the sidecar dials 127.0.0.1 while the
//! certificate names the Service.

use std::path::Path;
use std::sync::Arc;

use rustls::ClientConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::TlsConnector;

use crate::cli::config::TlsConfig;

/// A TLS setup that failed; names the file or setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("VALKEY_TLS_CA_FILE {path}: {reason}")]
    Ca { path: String, reason: String },
    #[error("VALKEY_TLS_CERT_FILE/VALKEY_TLS_KEY_FILE: {0}")]
    ClientCert(String),
    #[error("VALKEY_TLS_SERVER_NAME {0:?} is not a valid DNS name or IP address")]
    ServerName(String),
}

/// What a connection needs to start TLS: the files' paths, read again for every connection, so a
/// rotated CA or client certificate is used from the next connection on, without a restart.
/// (Kubernetes swaps a Secret volume's files in one rename, so a read never mixes old and new.)
#[derive(Clone)]
pub struct Tls {
    config: TlsConfig,
    pub server_name: ServerName<'static>,
}

impl Tls {
    /// A connector from the files as they are now.
    pub fn connector(&self) -> Result<TlsConnector, TlsSetupError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let roots = roots(&self.config.ca_file)?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsSetupError::ClientCert(e.to_string()))?
            .with_root_certificates(roots);
        let config = match &self.config.client_cert {
            Some((cert, key)) => builder
                .with_client_auth_cert(certs(cert)?, key_of(key)?)
                .map_err(|e| TlsSetupError::ClientCert(e.to_string()))?,
            None => builder.with_no_client_auth(),
        };
        Ok(TlsConnector::from(Arc::new(config)))
    }
}

impl Tls {
    /// The files a connection reads: the CA and the client certificate and key.
    pub fn files(&self) -> Vec<&Path> {
        let client = self.config.client_cert.iter();
        let client = client.flat_map(|(c, k)| [c.as_path(), k.as_path()]);
        std::iter::once(self.config.ca_file.as_path())
            .chain(client)
            .collect()
    }
}

/// A hash of `files`' contents; `None` when there are none or one cannot be read. Contents, not
/// times: a Secret volume's files are new inodes at every sync of the volume, changed or not.
pub async fn fingerprint(files: &[&Path]) -> Option<u64> {
    use std::hash::Hasher;
    if files.is_empty() {
        return None;
    }
    let mut hasher = std::hash::DefaultHasher::new();
    for file in files {
        let bytes = tokio::fs::read(file).await.ok()?;
        hasher.write(&bytes);
        hasher.write_u8(0);
    }
    Some(hasher.finish())
}

/// Checks the settings and reads the files once, so a bad setup stops the agent at start.
pub fn build(cfg: &TlsConfig) -> Result<Tls, TlsSetupError> {
    let server_name = ServerName::try_from(cfg.server_name.clone())
        .map_err(|_| TlsSetupError::ServerName(cfg.server_name.clone()))?;
    let tls = Tls {
        config: cfg.clone(),
        server_name,
    };
    tls.connector()?;
    Ok(tls)
}

fn roots(path: &Path) -> Result<rustls::RootCertStore, TlsSetupError> {
    let ca_err = |reason: String| TlsSetupError::Ca {
        path: path.display().to_string(),
        reason,
    };
    let mut store = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(|e| ca_err(e.to_string()))? {
        let cert = cert.map_err(|e| ca_err(e.to_string()))?;
        store.add(cert).map_err(|e| ca_err(e.to_string()))?;
    }
    if store.is_empty() {
        return Err(ca_err("no certificate found".into()));
    }
    Ok(store)
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let err = |e: rustls::pki_types::pem::Error| {
        TlsSetupError::ClientCert(format!("{}: {e}", path.display()))
    };
    CertificateDer::pem_file_iter(path)
        .map_err(err)?
        .collect::<Result<_, _>>()
        .map_err(err)
}

fn key_of(path: &Path) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|e| TlsSetupError::ClientCert(format!("{}: {e}", path.display())))
}
