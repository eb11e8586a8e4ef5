//! The harness's TLS client side (rustls, as the agent): which CA it trusts, which name it
//! verifies in the server's certificate (and sends as SNI) whatever address it dials, and the
//! client certificate it presents when the server asks for one.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

use crate::Result;

/// A TLS stream over TCP, its handshake done.
pub type TlsStream = StreamOwned<ClientConnection, TcpStream>;

/// What a TLS client trusts, verifies and presents. Clones (and [`TlsClient::named`] ones) share
/// the trust and the certificate: [`TlsClient::reload`] changes them for all, as an application
/// re-reading its rotated files does.
#[derive(Clone, Debug)]
pub struct TlsClient {
    config: Arc<RwLock<Arc<ClientConfig>>>,
    /// The DNS name verified in the server's certificate.
    pub server_name: String,
}

impl TlsClient {
    /// Trusting the CAs in the PEM file `ca`, verifying `server_name`, presenting `client`
    /// (certificate and key PEM files) when given.
    pub fn new(ca: &Path, client: Option<(&Path, &Path)>, server_name: &str) -> Result<TlsClient> {
        Ok(TlsClient {
            config: Arc::new(RwLock::new(config(ca, client)?)),
            server_name: server_name.into(),
        })
    }

    /// From the next handshake on, this client and every clone trust `ca` and present `client`.
    pub fn reload(&self, ca: &Path, client: Option<(&Path, &Path)>) -> Result<()> {
        let fresh = config(ca, client)?;
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = fresh;
        Ok(())
    }

    fn current(&self) -> Arc<ClientConfig> {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The certificate (DER) the server at `addr` presents in a handshake, which must pass.
    pub fn leaf_at(&self, addr: SocketAddr, timeout: Duration) -> io::Result<Vec<u8>> {
        let tcp = TcpStream::connect_timeout(&addr, timeout)?;
        tcp.set_read_timeout(Some(timeout))?;
        tcp.set_write_timeout(Some(timeout))?;
        let stream = self.wrap(tcp)?;
        let leaf = stream.conn.peer_certificates().and_then(|c| c.first());
        leaf.map(|c| c.to_vec())
            .ok_or_else(|| io::Error::other("no certificate presented"))
    }

    /// The same trust and certificate, verifying `name` instead.
    pub fn named(&self, name: &str) -> TlsClient {
        TlsClient {
            config: self.config.clone(),
            server_name: name.into(),
        }
    }

    /// `tcp` wrapped in TLS, the handshake completed: a certificate refused either way fails
    /// here, not at the first command.
    pub fn wrap(&self, tcp: TcpStream) -> io::Result<TlsStream> {
        let name = ServerName::try_from(self.server_name.clone()).map_err(io::Error::other)?;
        let conn = ClientConnection::new(self.current(), name).map_err(io::Error::other)?;
        let mut stream = StreamOwned::new(conn, tcp);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock)?;
        }
        Ok(stream)
    }
}

/// A rustls client configuration from PEM files.
fn config(ca: &Path, client: Option<(&Path, &Path)>) -> Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(ca).with_context(|| format!("{}", ca.display()))?;
    for cert in certs {
        roots.add(cert.with_context(|| format!("{}", ca.display()))?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
            let key =
                PrivateKeyDer::from_pem_file(key).with_context(|| format!("{}", key.display()))?;
            builder.with_client_auth_cert(chain, key)?
        }
    };
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resp::{ClientOptions, Conn};
    use crate::tls::{TLS_SERVER_NAME, TlsClientAuth, TlsOptions, TlsServer};

    #[test]
    fn commands_go_over_tls_and_a_wrong_name_or_ca_is_refused() {
        let opts = TlsOptions {
            auth_clients: TlsClientAuth::Yes,
            ..TlsOptions::default()
        };
        let server = TlsServer::start(opts).unwrap();
        let certs = server.certs();
        let client = Some((certs.client_cert(), certs.client_key()));
        let client = client.as_ref().map(|(c, k)| (c.as_path(), k.as_path()));
        let tls = TlsClient::new(&certs.ca_file(), client, TLS_SERVER_NAME).unwrap();
        let mut c =
            Conn::connect(server.addr(), &ClientOptions::default().tls(tls.clone())).unwrap();
        assert!(c.cmd(&["SET", "k", "v"]).unwrap().is_ok());
        let other = ClientOptions::default().tls(tls.named("elsewhere.test"));
        assert!(
            Conn::connect(server.addr(), &other).is_err(),
            "a name not in the certificate"
        );
        let wrong = TlsClient::new(&certs.wrong_ca_file(), client, TLS_SERVER_NAME).unwrap();
        let wrong = ClientOptions::default().tls(wrong);
        assert!(
            Conn::connect(server.addr(), &wrong).is_err(),
            "an unrelated CA"
        );
        let anonymous = TlsClient::new(&certs.ca_file(), None, TLS_SERVER_NAME).unwrap();
        let anonymous = ClientOptions::default().tls(anonymous);
        let refused = Conn::connect(server.addr(), &anonymous).and_then(|mut c| c.cmd(&["PING"]));
        assert!(refused.is_err(), "no client certificate: {refused:?}");
    }
}
