//! The TLS server, checked with `valkey-cli --tls`.

use std::process::Command;
use std::time::Instant;

use anyhow::{Result, ensure};
use valkey_sidecar_testkit::{TlsClientAuth, TlsOptions, TlsServer, tls_cli_bin};

#[test]
fn reachable_with_valkey_cli_tls() -> Result<()> {
    let started = Instant::now();
    let server = TlsServer::start(TlsOptions::default())?;
    eprintln!("TLS server (certs + start): {:?}", started.elapsed());
    let out = server.cli(&["PING"])?;
    ensure!(
        String::from_utf8_lossy(&out.stdout).trim() == "PONG",
        "stdout {:?} stderr {:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The server certificate does not chain to the unrelated CA.
    let wrong = Command::new(tls_cli_bin()?)
        .args([
            "--tls",
            "-h",
            &server.host(),
            "-p",
            &server.port().to_string(),
        ])
        .arg("--cacert")
        .arg(server.wrong_ca_file())
        .arg("PING")
        .output()?;
    ensure!(!String::from_utf8_lossy(&wrong.stdout).contains("PONG"));
    Ok(())
}

#[test]
fn required_client_certificates_reject_a_foreign_one() -> Result<()> {
    let server = TlsServer::start(TlsOptions {
        auth_clients: TlsClientAuth::Yes,
        requirepass: Some("pw".into()),
        ..TlsOptions::default()
    })?;
    ensure!(String::from_utf8_lossy(&server.cli(&["PING"])?.stdout).trim() == "PONG");
    let certs = server.certs();
    let foreign = Command::new(tls_cli_bin()?)
        .args([
            "--tls",
            "-h",
            &server.host(),
            "-p",
            &server.port().to_string(),
        ])
        .arg("--cacert")
        .arg(certs.ca_file())
        .arg("--cert")
        .arg(certs.wrong_client_cert())
        .arg("--key")
        .arg(certs.wrong_client_key())
        .env("REDISCLI_AUTH", "pw")
        .arg("PING")
        .output()?;
    ensure!(!String::from_utf8_lossy(&foreign.stdout).contains("PONG"));
    Ok(())
}
