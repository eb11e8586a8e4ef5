//! A single `ValkeyServer`: start, signals, restart, teardown.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use valkey_sidecar_testkit::redis::Value;
use valkey_sidecar_testkit::{ServerOptions, ValkeyServer, loopback_ip, wait_until};

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Alive = exists and is not a zombie. A server whose parent died is reparented and stays a zombie
/// until its new parent reaps it, which is not the harness's business.
fn process_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state letter follows the parenthesised command name.
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
    !matches!(state.and_then(|s| s.chars().next()), Some('Z' | 'X'))
}

#[test]
fn starts_answers_and_stops() -> Result<()> {
    let started = Instant::now();
    let server = ValkeyServer::start(ServerOptions::default())?;
    eprintln!("standalone start: {:?}", started.elapsed());
    ensure!(process_exists(server.pid()));
    ensure!(server.cmd(&["SET", "k", "v"])? == Value::Okay);
    ensure!(server.query::<String>(&["GET", "k"])? == "v");
    ensure!(server.info_field("replication", "role")? == "master");
    ensure!(server.info_field("persistence", "loading")? == "0");
    ensure!(server.log_tail(50).contains("Ready to accept connections"));
    server.terminate()?;
    ensure!(!server.is_running() && !process_exists(server.pid()));
    Ok(())
}

#[test]
fn restart_keeps_address_and_dir() -> Result<()> {
    let server = ValkeyServer::start(ServerOptions::default().bind(loopback_ip(31)))?;
    let (addr, dir, old_pid) = (server.addr(), server.dir().to_path_buf(), server.pid());
    server.kill()?;
    let started = Instant::now();
    server.restart()?;
    eprintln!("restart after kill: {:?}", started.elapsed());
    ensure!(server.addr() == addr && server.dir() == dir);
    ensure!(server.pid() != old_pid);
    ensure!(server.query::<String>(&["PING"])? == "PONG");
    // A restart of a live server stops it first.
    server.restart()?;
    ensure!(server.query::<String>(&["PING"])? == "PONG");
    Ok(())
}

#[test]
fn kill_makes_the_process_go_away() -> Result<()> {
    let server = ValkeyServer::start(ServerOptions::default())?;
    let pid = server.pid();
    server.kill()?;
    ensure!(!process_exists(pid), "/proc/{pid} still exists after kill");
    ensure!(!server.is_running());
    ensure!(server.cmd(&["PING"]).is_err());
    Ok(())
}

#[test]
fn drop_leaves_no_process_and_no_dir() -> Result<()> {
    let server = ValkeyServer::start(ServerOptions::default())?;
    let (pid, dir) = (server.pid(), server.dir().to_path_buf());
    ensure!(dir.join("valkey.log").exists());
    drop(server);
    ensure!(!process_exists(pid), "/proc/{pid} still exists after drop");
    ensure!(!dir.exists(), "{} still exists after drop", dir.display());
    Ok(())
}

#[test]
fn drop_during_a_panic_still_tears_down() -> Result<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let server = ValkeyServer::start(ServerOptions::default()).ok();
        let _ = tx.send(server.as_ref().map(|s| (s.pid(), s.dir().to_path_buf())));
        panic!("test failure while the server is up");
    })
    .join();
    ensure!(outcome.is_err());
    let Some((pid, dir)) = rx.recv()? else {
        anyhow::bail!("the server did not start");
    };
    ensure!(!process_exists(pid) && !dir.exists());
    Ok(())
}

#[test]
fn pause_and_resume() -> Result<()> {
    let opts = ServerOptions {
        command_timeout: Duration::from_millis(300),
        ..ServerOptions::default()
    };
    let server = ValkeyServer::start(opts)?;
    server.pause()?;
    ensure!(server.cmd(&["PING"]).is_err(), "a paused server answered");
    server.resume()?;
    ensure!(server.query::<String>(&["PING"])? == "PONG");
    Ok(())
}

#[test]
fn password_acl_user_and_zone() -> Result<()> {
    let server = ValkeyServer::start(
        ServerOptions::default()
            .bind(loopback_ip(32))
            .requirepass("secret")
            .user("user sidecar on >pw ~* +@all")
            .availability_zone("zone-b"),
    )?;
    ensure!(server.addr().ip() == loopback_ip(32));
    ensure!(server.query::<String>(&["PING"])? == "PONG");
    ensure!(server.info_field("server", "availability_zone")? == "zone-b");
    let mut sidecar = server.client_as("sidecar", "pw")?;
    let who: String = valkey_sidecar_testkit::redis::cmd("ACL")
        .arg("WHOAMI")
        .query(&mut sidecar)?;
    ensure!(who == "sidecar");
    ensure!(server.client_as("sidecar", "wrong").is_err());
    Ok(())
}

#[test]
fn a_bad_argument_fails_with_the_servers_complaint() -> Result<()> {
    let err = match ValkeyServer::start(ServerOptions::default().arg("no-such-directive", "1")) {
        Ok(_) => anyhow::bail!("the server started with a bogus directive"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(err.contains("exited during start-up"), "{err}");
    ensure!(err.contains("no-such-directive"), "{err}");
    Ok(())
}

/// The second safety net: when the test process dies without unwinding, `setpriv --pdeathsig KILL`
/// makes the kernel kill its servers. The test re-runs itself as a child that starts a server and
/// hangs, then SIGKILLs that child.
#[test]
fn servers_die_with_a_killed_test_process() -> Result<()> {
    const CHILD_ENV: &str = "VALKEY_TESTKIT_DEATH_CHILD";
    if std::env::var_os(CHILD_ENV).is_some() {
        let server = ValkeyServer::start(ServerOptions::default())?;
        println!("SERVER {} {}", server.pid(), server.dir().display());
        std::io::stdout().flush()?;
        std::thread::sleep(Duration::from_secs(30));
        return Ok(());
    }
    if !Path::new("/usr/bin/setpriv").exists() && !Path::new("/bin/setpriv").exists() {
        eprintln!("skipped: no setpriv");
        return Ok(());
    }
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "servers_die_with_a_killed_test_process",
            "--exact",
            "--nocapture",
        ])
        .env(CHILD_ENV, "1")
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child
        .stdout
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
    let line = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find(|l| l.starts_with("SERVER "));
    child.kill()?;
    child.wait()?;
    let line = line.ok_or_else(|| anyhow::anyhow!("the child started no server"))?;
    let mut fields = line.split_whitespace().skip(1);
    let pid: u32 = fields.next().unwrap_or_default().parse()?;
    // Nothing ran the child's Drop, so its dir is ours to clean up.
    if let Some(dir) = fields.next() {
        let _ = std::fs::remove_dir_all(dir);
    }
    let started = Instant::now();
    let gone = wait_until(Duration::from_secs(3), Duration::from_millis(10), || {
        !process_alive(pid)
    });
    eprintln!("server gone {:?} after its parent", started.elapsed());
    ensure!(gone, "valkey-server {pid} survived its killed test process");
    Ok(())
}
