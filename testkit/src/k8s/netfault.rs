//! Network faults between process-backed pods: each pod's processes run in a cgroup of their own
//! (as a real pod's do), and nftables rules drop what a pod's sockets send to chosen addresses —
//! another pod's IP, or the apiserver's port. A pod cut off this way sees connections hang and
//! time out, as across a real partition, while everything else on the loopback works.
//!
//! Needs root, a writable cgroup v2 hierarchy and the `nft` command (Debian's `nftables`; the
//! rules match `socket cgroupv2`). [`Cgroups::create`] fails loudly where that is missing, so a
//! test that depends on it cannot silently pass without it.
//!
//! Only packets a pod *sends* are dropped: cutting A from B means dropping A → B and B → A, which
//! breaks every TCP connection between them in both directions (each side's segments and ACKs are
//! lost). Rules live in one nftables table per [`NetFaults`], deleted when it drops.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, bail};

use crate::Result;
use crate::net::lock;

/// The cgroup v2 directory tree the pods of one kubelet live in.
pub struct Cgroups {
    /// Where cgroup v2 is mounted (`/sys/fs/cgroup` or `/sys/fs/cgroup/unified`).
    mount: PathBuf,
    /// This kubelet's directory, relative to the mount.
    root: PathBuf,
    /// Pod directories created so far (removed on drop, once their processes are gone).
    pods: Mutex<Vec<PathBuf>>,
}

/// Where cgroup v2 is mounted, from `/proc/self/mounts`.
fn cgroup2_mount() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").context("reading mounts")?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, at, kind) = (f.next()?, f.next()?, f.next()?);
            (kind == "cgroup2").then(|| PathBuf::from(at))
        })
        .next()
        .context("no cgroup v2 hierarchy is mounted")
}

static NEXT: AtomicU32 = AtomicU32::new(0);

impl Cgroups {
    /// A fresh directory for one kubelet's pods.
    pub fn create() -> Result<Cgroups> {
        let mount = cgroup2_mount()?;
        sweep(&mount);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let root = PathBuf::from(format!("valkey-testkit-{}-{n}", std::process::id()));
        std::fs::create_dir(mount.join(&root))
            .with_context(|| format!("creating cgroup {}", mount.join(&root).display()))?;
        Ok(Cgroups {
            mount,
            root,
            pods: Mutex::new(Vec::new()),
        })
    }

    /// Creates the cgroup of a pod (by uid) and returns its `cgroup.procs` file: a process that
    /// writes its pid there, and everything it starts, belongs to the pod.
    pub fn pod(&self, uid: &str) -> Result<PathBuf> {
        let rel = self.root.join(uid);
        let dir = self.mount.join(&rel);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        lock(&self.pods).push(dir.clone());
        Ok(dir.join("cgroup.procs"))
    }

    /// The pod's cgroup as nftables names it: the path below `/sys/fs/cgroup` and its depth in
    /// the cgroup v2 tree.
    fn nft_match(&self, uid: &str) -> Result<String> {
        let base = Path::new("/sys/fs/cgroup");
        let abs = self.mount.join(&self.root).join(uid);
        let rel = abs
            .strip_prefix(base)
            .with_context(|| format!("{} is not below {}", abs.display(), base.display()))?;
        let level = self.root.join(uid).components().count();
        Ok(format!(
            "socket cgroupv2 level {level} \"{}\"",
            rel.display()
        ))
    }
}

/// Removes the (empty) directories of test processes that are gone: a test killed outright
/// never ran its `Drop`.
fn sweep(mount: &Path) {
    let Ok(entries) = std::fs::read_dir(mount) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("valkey-testkit-")
            .and_then(|r| r.split('-').next())
        else {
            continue;
        };
        if Path::new("/proc").join(pid).exists() {
            continue;
        }
        let dir = entry.path();
        if let Ok(pods) = std::fs::read_dir(&dir) {
            for pod in pods.flatten().filter(|p| p.path().is_dir()) {
                let _ = std::fs::remove_dir(pod.path());
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        // Best effort: a cgroup can only be removed once its processes are gone.
        for dir in lock(&self.pods).drain(..) {
            let _ = std::fs::remove_dir(dir);
        }
        let _ = std::fs::remove_dir(self.mount.join(&self.root));
    }
}

/// A pod to cut, by uid, and the addresses it must no longer reach.
#[derive(Clone, Debug)]
pub struct Cut {
    pub from_uid: String,
    pub to: Ipv4Addr,
    /// `None`: every port.
    pub port: Option<u16>,
}

/// One nftables table of drop rules over the pods of a [`Cgroups`].
pub struct NetFaults {
    table: String,
}

fn nft(args: &[&str]) -> Result<()> {
    let out = Command::new("nft")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("running nft (Debian package nftables)")?;
    if !out.status.success() {
        bail!(
            "nft {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl NetFaults {
    /// An empty table with an output chain (nothing dropped yet).
    pub fn create() -> Result<NetFaults> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let table = format!("valkey_testkit_{}_{n}", std::process::id());
        nft(&["add", "table", "inet", &table])?;
        let hook = "{ type filter hook output priority 0 ; policy accept ; }";
        nft(&["add", "chain", "inet", &table, "out", hook])?;
        Ok(NetFaults { table })
    }

    /// Drops what the pod's sockets send to `cut.to` (and `cut.port`).
    pub fn drop(&self, cgroups: &Cgroups, cut: &Cut) -> Result<()> {
        let mut rule = format!("{} ip daddr {}", cgroups.nft_match(&cut.from_uid)?, cut.to);
        if let Some(port) = cut.port {
            rule.push_str(&format!(" tcp dport {port}"));
        }
        rule.push_str(" drop");
        nft(&["add", "rule", "inet", &self.table, "out", &rule])
    }

    /// Throttles what the pod sends from its port `sport` to `to` to `bytes_per_second` (the rest
    /// is dropped and retransmitted: TCP slows down), e.g. a primary's replication stream.
    pub fn throttle(
        &self,
        cgroups: &Cgroups,
        (from_uid, sport): (&str, u16),
        to: Ipv4Addr,
        bytes_per_second: u64,
    ) -> Result<()> {
        let rule = format!(
            "{} ip daddr {to} tcp sport {sport} limit rate over {bytes_per_second} bytes/second drop",
            cgroups.nft_match(from_uid)?
        );
        nft(&["add", "rule", "inet", &self.table, "out", &rule])
    }

    /// Removes every rule: the network is whole again.
    pub fn heal(&self) -> Result<()> {
        nft(&["flush", "chain", "inet", &self.table, "out"])
    }
}

impl Drop for NetFaults {
    fn drop(&mut self) {
        let _ = nft(&["delete", "table", "inet", &self.table]);
    }
}
