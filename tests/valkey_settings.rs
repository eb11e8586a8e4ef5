//! `valkey-sidecar valkey-settings` against a real `valkey-server` over its Unix socket, as the
//! chart runs it: logged in as the user that may only `CONFIG SET` (`core::credentials::
//! SETTINGS_RULES`), it pushes the zone the agent writes into a file — when the file changes and
//! again after Valkey restarts — and makes a TLS Valkey 8.0 serve a rotated certificate and CA.
//! A refused login is retried, never the end of the process; SIGTERM ends it with 0.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use valkey_sidecar_core::credentials::SETTINGS_RULES;
use valkey_sidecar_testkit::resp::{ClientOptions, Conn};
use valkey_sidecar_testkit::tls_client::TlsClient;
use valkey_sidecar_testkit::{
    ServerOptions, TlsCerts, TlsClientAuth, TlsOptions, TlsServer, ValkeyServer, cert_der,
    wait_until,
};

const SECOND: Duration = Duration::from_secs(1);
const USER: &str = "valkey-settings";
const POLL: Duration = Duration::from_millis(50);

/// The settings container's process, its log in `dir/settings.log`.
fn start(dir: &Path, socket: &Path, extra: &[&str]) -> Child {
    let log = std::fs::File::create(dir.join("settings.log")).unwrap();
    Command::new(env!("CARGO_BIN_EXE_valkey-sidecar"))
        .arg("valkey-settings")
        .arg("--socket")
        .arg(socket)
        .args(["--user", USER, "--password-file"])
        .arg(dir.join("password"))
        .arg("--zone-file")
        .arg(dir.join("zone"))
        .args(["--interval-ms", "100"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// SIGTERM, then the exit code.
fn stop(mut child: Child) -> Option<i32> {
    let pid = child.id().to_string();
    let killed = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(killed.success());
    child.wait().unwrap().code()
}

/// `user valkey-settings` as the chart's valkey-config writes it, with password `pw`.
fn settings_user(pw: &str) -> String {
    format!("{USER} on >{pw} {SETTINGS_RULES}")
}

fn socket_args(socket: &Path) -> Vec<(String, Vec<String>)> {
    vec![
        ("unixsocket".into(), vec![socket.display().to_string()]),
        ("unixsocketperm".into(), vec!["700".into()]),
    ]
}

fn zone_of(s: &ValkeyServer) -> String {
    let reply: Vec<String> = s.query(&["CONFIG", "GET", "availability-zone"]).unwrap();
    reply[1].clone()
}

fn wait_zone(s: &ValkeyServer, zone: &str) {
    let ok = wait_until(10 * SECOND, POLL, || zone_of(s) == zone);
    assert!(ok, "availability-zone {:?}, wanted {zone:?}", zone_of(s));
}

/// Writes `text` to `path` as the kubelet and the agent do: whole, then renamed into place.
fn put(path: &Path, text: &[u8]) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).unwrap();
    std::fs::rename(&partial, path).unwrap();
}

#[test]
fn the_zone_is_pushed_when_it_changes_and_after_a_restart_by_a_user_that_may_only_config_set() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("valkey.sock");
    let server = ValkeyServer::start(ServerOptions {
        users: vec![settings_user("right")],
        extra_args: socket_args(&socket),
        ..Default::default()
    })
    .unwrap();
    // A wrong password first: refused, logged, retried with the file read again.
    put(&dir.path().join("password"), b"wrong");
    put(&dir.path().join("zone"), b"zone-a");
    let child = start(dir.path(), &socket, &[]);
    let log = dir.path().join("settings.log");
    let refused = wait_until(10 * SECOND, POLL, || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("cannot update valkey's settings"))
    });
    assert!(refused, "{:?}", std::fs::read_to_string(&log));
    assert_eq!(zone_of(&server), "");
    put(&dir.path().join("password"), b"right");
    wait_zone(&server, "zone-a");
    put(&dir.path().join("zone"), b"zone-b\n");
    wait_zone(&server, "zone-b");
    // Valkey forgets CONFIG SET on restart: pushed again on the new connection.
    server.restart().unwrap();
    wait_zone(&server, "zone-b");
    // The user may set, and nothing else: no key, no CONFIG GET.
    let mut conn = server.client_as(USER, "right").unwrap();
    let get: redis::RedisResult<redis::Value> = redis::cmd("GET").arg("k").query(&mut conn);
    let config_get: redis::RedisResult<redis::Value> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("masterauth")
        .query(&mut conn);
    assert!(
        get.is_err() && config_get.is_err(),
        "{get:?} {config_get:?}"
    );
    assert_eq!(stop(child), Some(0), "SIGTERM ends it cleanly");
}

/// A TLS-only Valkey 8.0.1 (no `tls-auto-reload-interval`), clients' certificates required,
/// its files rotated in place in three steps as cert-manager and a CA change do: the CA file a
/// bundle of old and new CA (clients of the new CA accepted), then a certificate and key from the
/// new CA (served), then the new CA alone (clients of the old one refused). Each served to new
/// clients once the settings process has set the files again.
#[test]
fn a_rotated_certificate_and_ca_are_served_by_valkey_8_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("valkey.sock");
    let mut extra_args = socket_args(&socket);
    extra_args.push((
        "user".into(),
        settings_user("pw").split(' ').map(String::from).collect(),
    ));
    let server = TlsServer::start(TlsOptions {
        extra_args,
        auth_clients: TlsClientAuth::Yes,
        ..Default::default()
    })
    .unwrap();
    put(&dir.path().join("password"), b"pw");
    let old = server.certs();
    let files = [old.server_cert(), old.server_key(), old.ca_file()];
    let paths: Vec<String> = files.iter().map(|f| f.display().to_string()).collect();
    let flags = ["--tls-cert-file", "--tls-key-file", "--tls-ca-cert-file"];
    let args: Vec<&str> = flags
        .iter()
        .zip(&paths)
        .flat_map(|(f, p)| [*f, p.as_str()])
        .collect();
    let new_dir = tempfile::tempdir().unwrap();
    let new = TlsCerts::generate(new_dir.path(), &[]).unwrap();
    let bundle = new_dir.path().join("bundle.crt");
    let cas = [old.ca_file(), new.ca_file()].map(|f| std::fs::read(f).unwrap());
    std::fs::write(&bundle, cas.concat()).unwrap();
    let (with_old, with_new) = (client(&bundle, old), client(&bundle, &new));
    let pings = |tls: &TlsClient| {
        let opts = ClientOptions::default().tls(tls.clone());
        Conn::connect(server.addr(), &opts)
            .and_then(|mut c| c.cmd(&["PING"]))
            .is_ok_and(|r| !r.is_error())
    };
    let before = (pings(&with_old), pings(&with_new));
    assert_eq!(before, (true, false), "before: the old CA only");
    let child = start(dir.path(), &socket, &args);
    let log = || std::fs::read_to_string(dir.path().join("settings.log")).unwrap();

    // 1. The CA bundle.
    put(&files[2], &std::fs::read(&bundle).unwrap());
    let trusted = wait_until(10 * SECOND, POLL, || pings(&with_new));
    assert!(
        trusted,
        "clients of the new CA refused; settings log: {}",
        log()
    );
    // 2. A certificate and key of the new CA.
    put(&files[0], &std::fs::read(new.server_cert()).unwrap());
    put(&files[1], &std::fs::read(new.server_key()).unwrap());
    let leaf = cert_der(&new.server_cert()).unwrap();
    let served = wait_until(10 * SECOND, POLL, || {
        with_new
            .leaf_at(server.addr(), SECOND)
            .is_ok_and(|l| l == leaf)
    });
    assert!(
        served,
        "the new certificate not served; settings log: {}",
        log()
    );
    // 3. The new CA alone.
    put(&files[2], &std::fs::read(new.ca_file()).unwrap());
    let dropped = wait_until(10 * SECOND, POLL, || !pings(&with_old) && pings(&with_new));
    assert!(dropped, "the old CA still trusted; settings log: {}", log());
    assert!(
        log().contains("valkey read its TLS files again"),
        "{}",
        log()
    );
    assert_eq!(stop(child), Some(0));
}

/// Trusting `ca`, presenting `certs`' client certificate.
fn client(ca: &Path, certs: &TlsCerts) -> TlsClient {
    let (c, k) = (certs.client_cert(), certs.client_key());
    TlsClient::new(ca, Some((&c, &k)), valkey_sidecar_testkit::TLS_SERVER_NAME).unwrap()
}
