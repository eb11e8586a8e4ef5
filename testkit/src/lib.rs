//! Real `valkey-server` processes on loopback for tests, the demo and benchmarks.
//!
//! - [`ValkeyServer`]: one server with its own temp dir; signals (`kill`, `terminate`, `pause`,
//!   `resume`), `restart` on the same port and dir, log access.
//! - [`ReplicationSet`]: a primary and N replicas, synced before `start` returns.
//! - [`ValkeyCluster`]: a real Valkey Cluster formed with cluster commands, `cluster_state:ok`
//!   everywhere before `start` returns.
//! - [`TlsServer`]: a TLS-only server (Valkey 8.0.1 built with TLS) with a generated CA, server and client
//!   certificates, and an unrelated CA for mismatch tests.
//!
//! The `valkey-server` binary comes from `$VALKEY_SERVER`, else from `scripts/valkey-bin.sh`
//! (valkey 9.1.2, installed into a cache on first use). Every server gets `--save ''`,
//! `--appendonly no`, `--enable-debug-command yes`, `--repl-diskless-sync-delay 0`,
//! `--repl-diskless-load flush-before-load` (a full sync then takes ~50 ms instead of ~1 s) and a
//! logfile in its temp dir; [`ServerOptions::arg`] overrides any of them.
//!
//! Teardown: dropping a server kills it (SIGKILL), reaps it and deletes its dir, also when the test
//! panics (the log tail is printed then). If the test process itself dies, `setpriv --pdeathsig
//! KILL` (util-linux, used when present) makes the kernel kill the servers; see the `process` module
//! notes on why all servers are spawned from one long-lived thread. Set `VALKEY_TESTKIT_KEEP_DIRS=1`
//! to keep the dirs for a post-mortem (a control plane's too, with its audit log).
//!
//! Everything here is synchronous and blocks while it waits (polling every 20 ms). From async tests,
//! start topologies before entering the runtime or inside `tokio::task::spawn_blocking`; the handles
//! are `Send + Sync`, so they can then be shared with the code under test in an `Arc`.
//!
//! ```no_run
//! use std::time::Duration;
//! use valkey_sidecar_testkit::{
//!     ClusterOptions, ReplicationSet, ServerOptions, ValkeyCluster, ValkeyServer, loopback_ip,
//! };
//!
//! # fn main() -> anyhow::Result<()> {
//! // One server on its own address, with a password and an ACL user for the sidecar.
//! let server = ValkeyServer::start(
//!     ServerOptions::default()
//!         .bind(loopback_ip(10))
//!         .requirepass("secret")
//!         .user("sidecar on >pw ~* +@all")
//!         .availability_zone("zone-a"),
//! )?;
//! server.cmd(&["SET", "k", "v"])?;
//! assert_eq!(server.info_field("server", "availability_zone")?, "zone-a");
//! let mut sidecar = server.client_as("sidecar", "pw")?;
//! let _: String = redis::cmd("PING").query(&mut sidecar)?;
//!
//! // A primary with two synced replicas.
//! let set = ReplicationSet::start(2, ServerOptions::default())?;
//! set.primary().kill()?;
//!
//! // Three shards with one replica each, one 127.0.0.x per node, zones spread per shard.
//! let cluster = ValkeyCluster::start(
//!     3,
//!     1,
//!     ClusterOptions::default().first_ip(20).zones(["a", "b"]),
//! )?;
//! assert_eq!(cluster.shard_ids()?.len(), 3);
//! cluster.replicas_of(0)[0].cmd(&["CLUSTER", "FAILOVER"])?;
//! cluster.wait_healthy(Duration::from_secs(5))?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]
// Testkit and bench are read and changed as often as the agent: the same length limit.
#![warn(clippy::too_many_lines)]

mod agent;
mod binaries;
mod cluster;
pub mod faults;
mod info;
pub mod k8s;
mod net;
pub mod process;
mod replication;
mod repo;
pub mod resp;
mod server;
mod tls;
pub mod tls_client;

pub use agent::{Agent, AgentOptions, http_get};
pub use binaries::{
    TLS_SERVER_ENV, VALKEY_SERVER_ENV, tls_cli_bin, tls_server_bin, valkey_server_bin,
    valkey_server_for_tag,
};
pub use cluster::{CLUSTER_SLOTS, ClusterOptions, ValkeyCluster};
pub use info::info_field;
pub use net::{free_port, lock, loopback_ip, wait_for, wait_until};
pub use process::{KEEP_DIRS_ENV, as_from_a_shell};
pub use replication::{ReplicationOptions, ReplicationSet};
pub use repo::repo_root;
pub use server::{
    DEFAULT_CLUSTER_NODE_TIMEOUT_MS, POLL, ServerOptions, ValkeyServer, cached_query,
};
pub use tls::{TLS_SERVER_NAME, TlsCerts, TlsClientAuth, TlsOptions, TlsServer, cert_der};

/// Re-exported so tests use the same `redis` version as the harness (`redis::Value`, `redis::Role`).
pub use redis;

/// `anyhow::Result`: this is test support, where context-rich errors beat typed ones.
pub type Result<T, E = anyhow::Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    /// Servers are shared with the code under test (e.g. in an `Arc` across tokio tasks).
    #[test]
    fn handles_are_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<crate::ValkeyServer>();
        send_sync::<crate::ReplicationSet>();
        send_sync::<crate::ValkeyCluster>();
        send_sync::<crate::TlsServer>();
    }
}
