//! A TLS-enabled server and the certificates to talk to it.
//!
//! The PyPI valkey builds have no TLS, so this runs Valkey 8.0.1 built with `BUILD_TLS=yes` from
//! the vendored source (`scripts/valkey-src-bin.sh`). Certificates come from the `openssl` CLI: a CA, a server certificate for
//! `IP:127.0.0.1`/`DNS:valkey.test`, a client certificate, and an unrelated second CA (with its own
//! client certificate) for mismatch tests. Keys are ECDSA P-256, which rustls and OpenSSL both accept.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};

use crate::Result;
use crate::binaries::{tls_cli_bin, tls_server_bin};
use crate::net::free_port;
use crate::process::{ProcessSpec, ServerProcess};
use crate::server::POLL;

/// DNS name in the server certificate, for SNI/hostname-verification tests.
pub const TLS_SERVER_NAME: &str = "valkey.test";

const BIND_ATTEMPTS: usize = 5;
const TERMINATE_TIMEOUT: Duration = Duration::from_secs(10);
const ERROR_TAIL_LINES: usize = 30;

/// Paths of a generated certificate set (PEM files).
#[derive(Clone, Debug)]
pub struct TlsCerts {
    dir: PathBuf,
}

impl TlsCerts {
    /// Generates a CA, a server certificate (SANs: 127.0.0.1, each of `extra_ips`, `valkey.test`,
    /// `localhost`), a client certificate and a second, unrelated CA with its own client
    /// certificate, into `dir`.
    pub fn generate(dir: &Path, extra_ips: &[IpAddr]) -> Result<Self> {
        let mut sans: Vec<String> = extra_ips.iter().map(|ip| format!("IP:{ip}")).collect();
        sans.extend([format!("DNS:{TLS_SERVER_NAME}"), "DNS:localhost".into()]);
        Self::generate_with(dir, TLS_SERVER_NAME, &sans, "serverAuth")
    }

    /// Like [`TlsCerts::generate`], but the server certificate names `names` (DNS) and
    /// 127.0.0.1 and is good for client authentication too (Valkey dials its peers with it:
    /// replication and the cluster bus): what a cert-manager `Certificate` writes into the
    /// `kubernetes.io/tls` Secret the chart mounts.
    pub fn generate_for(dir: &Path, names: &[String]) -> Result<Self> {
        let sans: Vec<String> = names.iter().map(|n| format!("DNS:{n}")).collect();
        let cn = names.first().map_or(TLS_SERVER_NAME, String::as_str);
        Self::generate_with(dir, cn, &sans, "serverAuth,clientAuth")
    }

    /// The CAs and certificates, the server's named `cn`, with 127.0.0.1 and `sans`, for
    /// `usages` (extended key usages).
    fn generate_with(dir: &Path, cn: &str, sans: &[String], usages: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let certs = Self {
            dir: dir.to_path_buf(),
        };
        certs.make_ca("ca", "valkey-testkit CA")?;
        certs.make_ca("wrong-ca", "unrelated CA")?;
        let server_ext = format!(
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
             extendedKeyUsage={usages}\nsubjectAltName=IP:127.0.0.1,{}\n",
            sans.join(",")
        );
        let client_ext = "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n\
                          extendedKeyUsage=clientAuth\n";
        certs.make_leaf("server", cn, "ca", 2, &server_ext)?;
        certs.make_leaf("client", "valkey-testkit client", "ca", 3, client_ext)?;
        let wrong = ("wrong-client", "unrelated client", "wrong-ca");
        certs.make_leaf(wrong.0, wrong.1, wrong.2, 4, client_ext)?;
        Ok(certs)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The CA that signed the server and client certificates.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// A client certificate signed by [`Self::ca_file`].
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.crt")
    }

    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// A CA that signed neither the server's nor the client's certificate.
    pub fn wrong_ca_file(&self) -> PathBuf {
        self.dir.join("wrong-ca.crt")
    }

    /// A client certificate signed by [`Self::wrong_ca_file`]: the server must reject it.
    pub fn wrong_client_cert(&self) -> PathBuf {
        self.dir.join("wrong-client.crt")
    }

    pub fn wrong_client_key(&self) -> PathBuf {
        self.dir.join("wrong-client.key")
    }

    fn make_ca(&self, name: &str, cn: &str) -> Result<()> {
        let subj = format!("/CN={cn}");
        let [key, crt] = ["key", "crt"].map(|e| format!("{name}.{e}"));
        let mut args = vec!["req", "-x509", "-days", "3650"];
        args.extend(NEW_EC_KEY);
        args.extend(["-subj", &subj, "-keyout", &key, "-out", &crt]);
        // webpki insists on a proper CA certificate: basicConstraints CA:TRUE and keyCertSign.
        args.extend(["-addext", "basicConstraints=critical,CA:TRUE"]);
        args.extend(["-addext", "keyUsage=critical,keyCertSign,cRLSign"]);
        openssl(&self.dir, &args)
    }

    /// A key, a CSR and a certificate signed by `ca` with the extensions in `ext`.
    fn make_leaf(&self, name: &str, cn: &str, ca: &str, serial: u32, ext: &str) -> Result<()> {
        let subj = format!("/CN={cn}");
        let [key, csr, crt, ext_file] = ["key", "csr", "crt", "ext"].map(|e| format!("{name}.{e}"));
        let (ca_crt, ca_key, serial) =
            (format!("{ca}.crt"), format!("{ca}.key"), serial.to_string());
        std::fs::write(self.dir.join(&ext_file), ext)?;
        let mut req = vec!["req", "-new"];
        req.extend(NEW_EC_KEY);
        req.extend(["-subj", &subj, "-keyout", &key, "-out", &csr]);
        openssl(&self.dir, &req)?;
        let mut sign = vec!["x509", "-req", "-in", &csr, "-out", &crt, "-days", "3650"];
        sign.extend(["-CA", &ca_crt, "-CAkey", &ca_key, "-set_serial", &serial]);
        sign.extend(["-extfile", &ext_file]);
        openssl(&self.dir, &sign)
    }
}

/// The first certificate of the PEM file `path`, DER-encoded (what a TLS peer presents).
pub fn cert_der(path: &Path) -> Result<Vec<u8>> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let cert =
        CertificateDer::from_pem_file(path).with_context(|| format!("{}", path.display()))?;
    Ok(cert.to_vec())
}

/// `openssl req` options for a new ECDSA P-256 key without a passphrase.
const NEW_EC_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

fn openssl(dir: &Path, args: &[&str]) -> Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .context("running openssl (is it installed?)")?;
    if !out.status.success() {
        bail!(
            "openssl {} failed: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// `tls-auth-clients`: whether the server asks for a client certificate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsClientAuth {
    /// Clients must not need a certificate (`no`).
    No,
    /// A certificate is verified if presented (`optional`).
    #[default]
    Optional,
    /// A valid client certificate is required (`yes`).
    Yes,
}

impl TlsClientAuth {
    fn as_arg(self) -> &'static str {
        match self {
            Self::No => "no",
            Self::Optional => "optional",
            Self::Yes => "yes",
        }
    }
}

/// How to start a [`TlsServer`]. `Default`: 127.0.0.1, free port, client certs optional.
#[derive(Clone, Debug)]
pub struct TlsOptions {
    pub bind: IpAddr,
    /// The TLS port; `None` picks a free one. The plain port is disabled (`--port 0`).
    pub port: Option<u16>,
    pub auth_clients: TlsClientAuth,
    pub requirepass: Option<String>,
    /// Extra `--name value...` arguments, appended last.
    pub extra_args: Vec<(String, Vec<String>)>,
    pub startup_timeout: Duration,
}

impl Default for TlsOptions {
    fn default() -> Self {
        Self {
            bind: IpAddr::V4(Ipv4Addr::LOCALHOST),
            port: None,
            auth_clients: TlsClientAuth::default(),
            requirepass: None,
            extra_args: Vec::new(),
            startup_timeout: Duration::from_secs(10),
        }
    }
}

/// A TLS-only `valkey-server` with generated certificates. Dropping it kills the process and removes
/// its dir, certificates included.
pub struct TlsServer {
    process: ServerProcess,
    addr: SocketAddr,
    certs: TlsCerts,
    password: Option<String>,
    startup_timeout: Duration,
}

impl TlsServer {
    /// Generates certificates, starts the server and waits until it accepts connections.
    pub fn start(opts: TlsOptions) -> Result<Self> {
        let bin = tls_server_bin()?;
        let mut last_error = None;
        for _ in 0..BIND_ATTEMPTS {
            match Self::try_start(&bin, &opts) {
                Ok(server) => return Ok(server),
                Err((true, e)) if opts.port.is_none() => last_error = Some(e),
                Err((_, e)) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow!("no start attempt was made")))
            .context(format!("valkey-server lost its port {BIND_ATTEMPTS} times"))
    }

    /// `Err((bind_conflict, error))`.
    fn try_start(bin: &Path, opts: &TlsOptions) -> Result<Self, (bool, anyhow::Error)> {
        let plain = |e: anyhow::Error| (false, e);
        let port = match opts.port {
            Some(p) => p,
            None => free_port(opts.bind).map_err(plain)?,
        };
        let dir = tempfile::Builder::new()
            .prefix("valkey-testkit-tls-")
            .tempdir()
            .map_err(|e| plain(e.into()))?;
        let extra_ips: Vec<IpAddr> = Some(opts.bind)
            .filter(|ip| *ip != IpAddr::V4(Ipv4Addr::LOCALHOST))
            .into_iter()
            .collect();
        let certs = TlsCerts::generate(&dir.path().join("tls"), &extra_ips).map_err(plain)?;
        let log = dir.path().join("valkey.log");
        let addr = SocketAddr::new(opts.bind, port);
        let spec = ProcessSpec {
            program: bin.to_path_buf(),
            args: tls_args(opts, port, &certs, dir.path(), &log),
            label: format!("valkey-server (TLS) {addr}"),
        };
        let server = Self {
            process: ServerProcess::spawn(spec, dir, log).map_err(plain)?,
            addr,
            certs,
            password: opts.requirepass.clone(),
            startup_timeout: opts.startup_timeout,
        };
        server.wait_serving()?;
        Ok(server)
    }

    /// Ready = still running, the port accepts TCP, and the log says so (a TCP accept alone could
    /// come from a stranger that holds the port).
    fn wait_serving(&self) -> Result<(), (bool, anyhow::Error)> {
        let deadline = Instant::now() + self.startup_timeout;
        loop {
            if let Some(status) = self.process.exit_status() {
                let conflict = self
                    .process
                    .log_tail(ERROR_TAIL_LINES)
                    .contains("Address already in use");
                return Err((conflict, self.failure(&format!("exited ({status})"))));
            }
            let listening =
                TcpStream::connect_timeout(&self.addr, Duration::from_millis(200)).is_ok();
            if listening
                && self
                    .process
                    .log_tail(usize::MAX)
                    .contains("Ready to accept")
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err((false, self.failure("did not start in time")));
            }
            std::thread::sleep(POLL);
        }
    }

    fn failure(&self, what: &str) -> anyhow::Error {
        anyhow!(
            "{} {what}\n{}",
            self.process.label(),
            self.process.diagnostics(ERROR_TAIL_LINES)
        )
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn host(&self) -> String {
        self.addr.ip().to_string()
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// All generated certificate paths.
    pub fn certs(&self) -> &TlsCerts {
        &self.certs
    }

    pub fn ca_file(&self) -> PathBuf {
        self.certs.ca_file()
    }

    pub fn client_cert(&self) -> PathBuf {
        self.certs.client_cert()
    }

    pub fn client_key(&self) -> PathBuf {
        self.certs.client_key()
    }

    pub fn wrong_ca_file(&self) -> PathBuf {
        self.certs.wrong_ca_file()
    }

    pub fn log_tail(&self, n: usize) -> String {
        self.process.log_tail(n)
    }

    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// The server's logfile.
    pub fn log_path(&self) -> PathBuf {
        self.process.log_path().to_path_buf()
    }

    /// SIGKILL and reap.
    pub fn kill(&self) -> Result<()> {
        self.process.kill()
    }

    /// SIGTERM and wait for a clean exit (SIGKILL after 10 s).
    pub fn terminate(&self) -> Result<()> {
        self.process.terminate(TERMINATE_TIMEOUT)
    }

    /// Stops the server if it runs (SIGTERM) and starts it again on the same port with the same
    /// certificates.
    pub fn restart(&self) -> Result<()> {
        self.terminate()?;
        self.process.relaunch()?;
        self.wait_serving().map_err(|(_, e)| e)
    }

    /// Runs `valkey-cli --tls` against this server with the good CA and client certificate (and
    /// the password, if any), e.g. `server.cli(&["PING"])`.
    pub fn cli(&self, args: &[&str]) -> Result<Output> {
        let mut cmd = Command::new(tls_cli_bin()?);
        cmd.args(["--tls", "-h", &self.host(), "-p", &self.port().to_string()])
            .arg("--cacert")
            .arg(self.ca_file())
            .arg("--cert")
            .arg(self.client_cert())
            .arg("--key")
            .arg(self.client_key());
        if let Some(pw) = &self.password {
            // Via the environment: `-a` makes the CLI print a warning into the output.
            cmd.env("VALKEYCLI_AUTH", pw).env("REDISCLI_AUTH", pw);
        }
        cmd.args(args).output().context("running valkey-cli --tls")
    }
}

fn tls_args(
    opts: &TlsOptions,
    port: u16,
    certs: &TlsCerts,
    dir: &Path,
    log: &Path,
) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    let mut set = |name: &str, value: OsString| {
        args.push(format!("--{name}").into());
        args.push(value);
    };
    set("port", "0".into());
    set("tls-port", port.to_string().into());
    set("bind", opts.bind.to_string().into());
    set("tls-cert-file", certs.server_cert().into());
    set("tls-key-file", certs.server_key().into());
    set("tls-ca-cert-file", certs.ca_file().into());
    set("tls-auth-clients", opts.auth_clients.as_arg().into());
    set("save", "".into());
    set("appendonly", "no".into());
    set("daemonize", "no".into());
    set("dir", dir.into());
    set("logfile", log.into());
    if let Some(pw) = &opts.requirepass {
        set("requirepass", pw.into());
    }
    for (name, values) in &opts.extra_args {
        args.push(format!("--{name}").into());
        args.extend(values.iter().map(OsString::from));
    }
    args
}
