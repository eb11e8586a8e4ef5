//! Pod IPs on the loopback.
//!
//! Linux routes all of 127.0.0.0/8 to `lo`, so every pod can have its own address with no set-up.
//! Pods get `127.<b>.<x>.<y>` with `b = 1 + pid % 200`: tests of one process never share an
//! address, and two test processes on the machine most likely use different blocks (the harness's
//! plain servers use `127.0.0.x`, fake nodes report `127.0.100.x`). An address on which one of the
//! pod's well-known ports is already bound (another process got there first) is skipped.
//! Addresses are not reused within a process, so a new pod never inherits a dead pod's peers.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::Mutex;

use anyhow::bail;
use k8s_openapi::api::core::v1::Pod;

use super::spec::{Kind, command_line, kind_of, split_wrapper, valkey_port};
use crate::Result;
use crate::net::lock;

/// Addresses tried before giving up.
const ATTEMPTS: u32 = 64;

/// Index of the next address to hand out in this process.
static NEXT: Mutex<u32> = Mutex::new(0);

/// This process's block of pod IPs, `127.<1..=200>.x.y`, claimed once against every other test
/// process (see [`crate::net::claim_block`]).
fn pod_block() -> u8 {
    static BLOCK: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
    *BLOCK.get_or_init(|| u8::try_from(1 + crate::net::claim_block("pods", 200)).unwrap_or(1))
}

/// A fresh pod IP on which all `ports` can be bound.
pub(crate) fn allocate(ports: &[u16]) -> Result<Ipv4Addr> {
    let block = pod_block();
    for _ in 0..ATTEMPTS {
        let n = {
            let mut next = lock(&NEXT);
            *next += 1;
            *next - 1
        };
        // 254 × 254 addresses per block; wrapping after that is far beyond any test.
        let (x, y) = (n / 254 % 254, n % 254);
        let ip = Ipv4Addr::new(127, block, (x + 1) as u8, (y + 1) as u8);
        if ports
            .iter()
            .all(|&p| TcpListener::bind(SocketAddr::from((ip, p))).is_ok())
        {
            return Ok(ip);
        }
    }
    bail!("no free pod IP in 127.{block}.0.0/16 after {ATTEMPTS} tries (ports {ports:?} taken)")
}

/// The ports the pod will listen on, as far as the spec tells: declared container ports, each
/// valkey container's `--port` and the agent's probe and admin ports (init containers too: the
/// agent may be a native sidecar).
pub(crate) fn ports_of(pod: &Pod) -> Vec<u16> {
    let mut ports = BTreeSet::new();
    let containers = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers));
    for c in containers {
        for p in c.ports.iter().flatten() {
            ports.extend(u16::try_from(p.container_port).ok());
        }
        match kind_of(c.image.as_deref().unwrap_or_default()) {
            Kind::Valkey => {
                ports.insert(valkey_port(split_wrapper(&command_line(c, &[])).1));
            }
            Kind::Sidecar => ports.extend([9736, 9737]),
            _ => {}
        }
    }
    ports.into_iter().collect()
}
