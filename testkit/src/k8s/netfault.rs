//! Network faults between process-backed pods and whole nodes: each pod's processes run in a
//! cgroup of their own (as a real pod's do), below a cgroup per node (`<root>/<node>/<pod uid>`),
//! and nftables rules drop packets by the cgroup of the socket that sends or receives them and by
//! address. A pod or node cut off this way sees connections hang and time out, as across a real
//! partition, while everything else on the loopback works.
//!
//! Needs root, a writable cgroup v2 hierarchy and the `nft` command (Debian's `nftables`; the
//! rules match `socket cgroupv2`). [`Cgroups::create`] fails loudly where that is missing, so a
//! test that depends on it cannot silently pass without it.
//!
//! **Layout.** One nftables table per [`NetFaults`], deleted when it drops, with an `output` and
//! an `input` base chain. Both first accept anything from or to [`OBSERVER_IP`]: that source
//! address is exempt from every fault, for checkers that must see both sides. The output chain
//! then jumps to `pairs` (pod-to-pod cuts, apiserver cuts, throttles: [`NetFaults::drop`],
//! [`NetFaults::throttle`], emptied by [`NetFaults::heal`]) and to one chain per node fault and
//! hook ([`NodeFault`]), so each fault is installed and removed on its own, atomically.
//!
//! **Pod cuts.** Only packets a pod *sends* are dropped: cutting A from B means dropping A → B and
//! B → A, which breaks every TCP connection between them in both directions (each side's
//! segments and ACKs are lost).
//!
//! **Node faults.** On the loopback every packet passes the output hook (with the sending socket)
//! and then the input hook (where nftables looks up the receiving socket), so a rule can ask who
//! sends and who receives. What makes it subtle: a pod's processes connect to other pods and to
//! the apiserver from `127.0.0.1` (the loopback route's source address), not from their pod IP.
//! - [`NodeFault::PowerOff`]: everything from or to the node's pod IPs and its InternalIP, and
//!   everything its pods' sockets send, is dropped.
//! - [`NodeFault::Partition`]: the node's pods reach only the node's pod IPs and InternalIP (a
//!   client bound to the InternalIP is "on the node"), nothing else — in particular not the
//!   apiserver, matched by port since both ends are `127.0.0.1`; and only the node's own sockets
//!   and clients from the InternalIP reach its pods. Packets that a node's socket sends to
//!   `127.0.0.1` are judged on arrival, by whether the receiving socket is the node's.
//!
//! What stays visible: packets the kernel itself sends on behalf of a socket that is gone (a
//! reset answering a peer that still talks to a killed process) carry no cgroup; from a pod IP
//! they are dropped, from `127.0.0.1` they are not.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{Context, bail};

use crate::Result;
use crate::net::lock;

/// A loopback address no pod or node uses (pods are in `127.1-200.x.y`, nodes report
/// `127.0.100-249.x`, plain servers use `127.0.0.x`): a client bound to it is exempt from every
/// network fault.
pub const OBSERVER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 99, 1);

/// The address processes connect from by default on the loopback.
const DEFAULT_SOURCE: Ipv4Addr = Ipv4Addr::LOCALHOST;

/// The cgroup v2 directory tree the pods of one kubelet live in: `<root>/<node>/<pod uid>`.
pub struct Cgroups {
    /// Where cgroup v2 is mounted (`/sys/fs/cgroup` or `/sys/fs/cgroup/unified`).
    mount: PathBuf,
    /// This kubelet's directory, relative to the mount.
    root: PathBuf,
    /// Pod uid → the pod's directory relative to the mount.
    pods: Mutex<HashMap<String, PathBuf>>,
    /// Every directory created below the root, in creation order (removed in reverse on drop,
    /// once their processes are gone).
    created: Mutex<Vec<PathBuf>>,
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
            pods: Mutex::new(HashMap::new()),
            created: Mutex::new(Vec::new()),
        })
    }

    /// Creates `rel` (relative to the mount) unless it exists.
    fn ensure(&self, rel: &Path) -> Result<PathBuf> {
        let dir = self.mount.join(rel);
        if !dir.is_dir() {
            std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
            lock(&self.created).push(dir.clone());
        }
        Ok(dir)
    }

    /// Creates the cgroup of a node (once): the parent of its pods' cgroups.
    pub fn node(&self, node: &str) -> Result<PathBuf> {
        self.ensure(&self.root.join(node))
    }

    /// Creates the cgroup of a pod (by uid) on `node` and returns its `cgroup.procs` file: a
    /// process that writes its pid there, and everything it starts, belongs to the pod.
    pub fn pod(&self, node: &str, uid: &str) -> Result<PathBuf> {
        self.node(node)?;
        let rel = self.root.join(node).join(uid);
        let dir = self.ensure(&rel)?;
        lock(&self.pods).insert(uid.to_owned(), rel);
        Ok(dir.join("cgroup.procs"))
    }

    /// The pod's cgroup as nftables matches it.
    fn pod_match(&self, uid: &str) -> Result<String> {
        let rel = lock(&self.pods)
            .get(uid)
            .cloned()
            .with_context(|| format!("pod {uid} has no cgroup"))?;
        self.nft_match(&rel)
    }

    /// The node's cgroup as nftables matches it: every socket of every pod of the node.
    fn node_match(&self, node: &str) -> Result<String> {
        self.node(node)?;
        self.nft_match(&self.root.join(node))
    }

    /// `socket cgroupv2 level <depth> "<path below /sys/fs/cgroup>"` for `rel`.
    fn nft_match(&self, rel: &Path) -> Result<String> {
        let base = Path::new("/sys/fs/cgroup");
        let abs = self.mount.join(rel);
        let below = abs
            .strip_prefix(base)
            .with_context(|| format!("{} is not below {}", abs.display(), base.display()))?;
        let level = rel.components().count();
        Ok(format!(
            "socket cgroupv2 level {level} \"{}\"",
            below.display()
        ))
    }

    /// SIGKILL to every process of the node's pods at once (`cgroup.kill`), children included.
    pub fn kill_node(&self, node: &str) -> Result<()> {
        let dir = self.node(node)?;
        std::fs::write(dir.join("cgroup.kill"), "1")
            .with_context(|| format!("killing the processes of {}", dir.display()))
    }
}

/// Every process of the cgroup whose `cgroup.procs` is `procs` (children a container started
/// too, e.g. Valkey's background save).
pub fn cgroup_pids(procs: &Path) -> Result<Vec<u32>> {
    let text =
        std::fs::read_to_string(procs).with_context(|| format!("reading {}", procs.display()))?;
    Ok(text.lines().filter_map(|l| l.trim().parse().ok()).collect())
}

/// SIGKILL to every process of the cgroup whose `cgroup.procs` is `procs`, at once.
pub fn kill_cgroup(procs: &Path) -> Result<()> {
    let kill = procs.with_file_name("cgroup.kill");
    std::fs::write(&kill, "1").with_context(|| format!("writing {}", kill.display()))
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
        remove_tree(&entry.path(), 3);
    }
}

/// Deletes the nftables tables a killed test process left behind (`valkey_testkit_<pid>_…` and
/// `valkey_testkit_part_<pid>_…` whose process is gone): a partition left installed would cut
/// addresses the next run reuses.
fn sweep_tables() {
    let Ok(out) = Command::new("nft")
        .args(["list", "tables"])
        .stdin(Stdio::null())
        .output()
    else {
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for table in text.lines().filter_map(|l| l.strip_prefix("table inet ")) {
        let Some(rest) = table.strip_prefix("valkey_testkit_") else {
            continue;
        };
        let pid = rest.strip_prefix("part_").unwrap_or(rest);
        let Some(pid) = pid.split('_').next() else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = nft(&["delete", "table", "inet", table]);
        }
    }
}

/// Removes `dir` and its subdirectories up to `depth` levels, deepest first (cgroup directories
/// go one by one; their files are not real files).
fn remove_tree(dir: &Path, depth: usize) {
    if depth > 1
        && let Ok(children) = std::fs::read_dir(dir)
    {
        for child in children.flatten().filter(|c| c.path().is_dir()) {
            remove_tree(&child.path(), depth - 1);
        }
    }
    let _ = std::fs::remove_dir(dir);
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        // Best effort: a cgroup can only be removed once its processes are gone.
        for dir in lock(&self.created).drain(..).rev() {
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

/// A fault of a whole node (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeFault {
    PowerOff,
    Partition,
}

impl NodeFault {
    fn tag(self) -> &'static str {
        match self {
            Self::PowerOff => "off",
            Self::Partition => "part",
        }
    }
}

/// What the node faults need to know about a node.
#[derive(Clone, Debug)]
pub struct NodeNet {
    pub name: String,
    /// The IPs of the pods the node runs.
    pub pod_ips: Vec<Ipv4Addr>,
    /// The node's InternalIP: a client bound to it counts as on the node.
    pub client_ip: Ipv4Addr,
    /// The apiserver's address, which a partitioned node's pods cannot reach.
    pub apiserver: SocketAddrV4,
}

/// Which base chain a rule belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hook {
    Output,
    Input,
}

impl Hook {
    fn chain(self) -> &'static str {
        match self {
            Self::Output => "out",
            Self::Input => "in",
        }
    }
}

/// One nftables table of drop rules over the pods of a [`Cgroups`].
pub struct NetFaults {
    table: String,
    /// Node fault chains created so far (each jumped to from its base chain).
    chains: Mutex<HashSet<String>>,
}

/// Runs `nft` with `args` (joined into one command).
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

/// Runs the commands as one `nft -f -` script: all of them apply, or none.
fn nft_script(commands: &[String]) -> Result<()> {
    let script = commands.join("\n") + "\n";
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .context("running nft (Debian package nftables)")?;
    child
        .stdin
        .take()
        .context("nft without stdin")?
        .write_all(script.as_bytes())
        .context("writing to nft")?;
    let out = child.wait_with_output().context("waiting for nft")?;
    if !out.status.success() {
        bail!(
            "nft -f: {}\nscript:\n{script}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl NetFaults {
    /// An empty table: base chains that exempt [`OBSERVER_IP`] and jump to `pairs` (nothing
    /// dropped yet).
    pub fn create() -> Result<NetFaults> {
        sweep_tables();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let table = format!("valkey_testkit_{}_{n}", std::process::id());
        let t = format!("inet {table}");
        let base = |name: &str, hook: &str| {
            format!(
                "add chain {t} {name} {{ type filter hook {hook} priority 0 ; policy accept ; }}"
            )
        };
        let mut script = vec![
            format!("add table {t}"),
            base("out", "output"),
            base("in", "input"),
            format!("add chain {t} pairs"),
        ];
        for chain in ["out", "in"] {
            script.push(format!(
                "add rule {t} {chain} ip saddr {OBSERVER_IP} accept"
            ));
            script.push(format!(
                "add rule {t} {chain} ip daddr {OBSERVER_IP} accept"
            ));
        }
        script.push(format!("add rule {t} out jump pairs"));
        nft_script(&script)?;
        Ok(NetFaults {
            table,
            chains: Mutex::new(HashSet::new()),
        })
    }

    /// Drops what the pod's sockets send to `cut.to` (and `cut.port`).
    pub fn drop(&self, cgroups: &Cgroups, cut: &Cut) -> Result<()> {
        let mut rule = format!("{} ip daddr {}", cgroups.pod_match(&cut.from_uid)?, cut.to);
        if let Some(port) = cut.port {
            rule.push_str(&format!(" tcp dport {port}"));
        }
        rule.push_str(" drop");
        nft(&["add", "rule", "inet", &self.table, "pairs", &rule])
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
            cgroups.pod_match(from_uid)?
        );
        nft(&["add", "rule", "inet", &self.table, "pairs", &rule])
    }

    /// Removes every pod cut and throttle (node faults stay: see [`Self::clear_node`]).
    pub fn heal(&self) -> Result<()> {
        nft(&["flush", "chain", "inet", &self.table, "pairs"])
    }

    /// Installs `fault` for `node` (see the module docs), all rules at once.
    pub fn fault_node(&self, cgroups: &Cgroups, fault: NodeFault, node: &NodeNet) -> Result<()> {
        let matcher = cgroups.node_match(&node.name)?;
        let rules = match fault {
            NodeFault::PowerOff => power_off_rules(&matcher, node),
            NodeFault::Partition => partition_rules(&matcher, node),
        };
        let mut script = Vec::new();
        for (hook, rule) in rules {
            let chain = self.node_chain(&mut script, fault, &node.name, hook);
            script.push(format!("add rule inet {} {chain} {rule}", self.table));
        }
        nft_script(&script)
    }

    /// Removes `fault` of `node`.
    pub fn clear_node(&self, fault: NodeFault, node: &str) -> Result<()> {
        let existing = lock(&self.chains).clone();
        let script: Vec<String> = [Hook::Output, Hook::Input]
            .into_iter()
            .map(|hook| chain_name(fault, node, hook))
            .filter(|chain| existing.contains(chain))
            .map(|chain| format!("flush chain inet {} {chain}", self.table))
            .collect();
        if script.is_empty() {
            return Ok(());
        }
        nft_script(&script)
    }

    /// The chain for `fault` of `node` at `hook`; adds the commands that create it (and the jump
    /// to it) to `script` the first time.
    fn node_chain(
        &self,
        script: &mut Vec<String>,
        fault: NodeFault,
        node: &str,
        hook: Hook,
    ) -> String {
        let chain = chain_name(fault, node, hook);
        let mut chains = lock(&self.chains);
        if chains.insert(chain.clone()) {
            let t = format!("inet {}", self.table);
            script.push(format!("add chain {t} {chain}"));
            script.push(format!("add rule {t} {} jump {chain}", hook.chain()));
        }
        chain
    }
}

/// `off_node_a1_out`: node names may hold characters nft identifiers do not.
fn chain_name(fault: NodeFault, node: &str, hook: Hook) -> String {
    let node: String = node
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    format!("{}_{node}_{}", fault.tag(), hook.chain())
}

/// `{ a, b, c }`, an nftables anonymous set.
fn set(ips: impl IntoIterator<Item = Ipv4Addr>) -> String {
    let items: Vec<String> = ips.into_iter().map(|ip| ip.to_string()).collect();
    format!("{{ {} }}", items.join(", "))
}

/// A powered-off node: silence. Nothing leaves its pods' sockets (their processes are killed
/// after these rules are in place, so even their FIN and RST stay in), nothing reaches its pod
/// IPs or its InternalIP, nothing leaves them (the kernel's resets for its dead sockets).
fn power_off_rules(node: &str, n: &NodeNet) -> Vec<(Hook, String)> {
    let addresses = set(n.pod_ips.iter().copied().chain([n.client_ip]));
    vec![
        (Hook::Output, format!("ip saddr {addresses} drop")),
        (Hook::Output, format!("ip daddr {addresses} drop")),
        (Hook::Output, format!("{node} drop")),
    ]
}

/// A partitioned node (see the module docs), rule by rule.
fn partition_rules(node: &str, n: &NodeNet) -> Vec<(Hook, String)> {
    let api = n.apiserver;
    let pods = n.pod_ips.iter().copied();
    // Where the node's sockets may send; `127.0.0.1` is judged on arrival.
    let reachable = set(pods.clone().chain([n.client_ip, DEFAULT_SOURCE]));
    let mut rules = vec![
        (
            Hook::Output,
            format!("{node} ip daddr {} tcp dport {} drop", api.ip(), api.port()),
        ),
        (Hook::Output, format!("{node} ip daddr != {reachable} drop")),
    ];
    if n.pod_ips.is_empty() {
        rules.push((Hook::Output, format!("{node} return")));
        rules.push((Hook::Output, format!("ip saddr {} drop", n.client_ip)));
        rules.push((
            Hook::Input,
            format!("ip daddr {DEFAULT_SOURCE} {node} drop"),
        ));
        return rules;
    }
    let pods = set(pods);
    rules.extend([
        // Packets from a pod IP without a full socket (handshakes, resets) have no cgroup.
        (
            Hook::Output,
            format!("ip saddr {pods} ip daddr != {reachable} drop"),
        ),
        (Hook::Output, format!("{node} return")),
        // Others reach the node's pods only from its InternalIP.
        (
            Hook::Output,
            format!("ip daddr {pods} ip saddr != {} drop", n.client_ip),
        ),
        // A client on the node reaches only the node's pods.
        (
            Hook::Output,
            format!("ip saddr {} ip daddr != {pods} drop", n.client_ip),
        ),
        // The node's sockets at 127.0.0.1 hear only the node's pods (not the apiserver, not
        // other pods answering an agent)...
        (
            Hook::Input,
            format!("ip daddr {DEFAULT_SOURCE} {node} ip saddr != {pods} drop"),
        ),
        // ... and the node's pods answer only the node's sockets at 127.0.0.1.
        (
            Hook::Input,
            format!("ip daddr {DEFAULT_SOURCE} ip saddr {pods} {node} return"),
        ),
        (
            Hook::Input,
            format!("ip daddr {DEFAULT_SOURCE} ip saddr {pods} drop"),
        ),
    ]);
    rules
}

/// A partition of plain loopback processes (no pods, no cgroups), for baselines run outside
/// Kubernetes: every packet between an address of `inside` and any other address is dropped,
/// both ways, except the observer's. It works because each such process binds its own address
/// and sources its outgoing connections from it (`bind-source-addr`), so the addresses alone
/// say which side a packet is on. Healed when dropped.
pub struct AddrPartition {
    table: String,
}

impl AddrPartition {
    /// Cuts `inside` (the partitioned side's servers and its clients' source addresses) from
    /// every other address at once.
    pub fn cut(inside: &[Ipv4Addr]) -> Result<AddrPartition> {
        sweep_tables();
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let table = format!("valkey_testkit_part_{}_{n}", std::process::id());
        let t = format!("inet {table}");
        let side = set(inside.iter().copied());
        nft_script(&[
            format!("add table {t}"),
            format!("add chain {t} out {{ type filter hook output priority 0 ; policy accept ; }}"),
            format!("add rule {t} out ip saddr {OBSERVER_IP} accept"),
            format!("add rule {t} out ip daddr {OBSERVER_IP} accept"),
            format!("add rule {t} out ip saddr {side} ip daddr != {side} drop"),
            format!("add rule {t} out ip daddr {side} ip saddr != {side} drop"),
        ])?;
        Ok(AddrPartition { table })
    }
}

impl Drop for AddrPartition {
    fn drop(&mut self) {
        let _ = nft(&["delete", "table", "inet", &self.table]);
    }
}

impl Drop for NetFaults {
    fn drop(&mut self) {
        let _ = nft(&["delete", "table", "inet", &self.table]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(pods: &[Ipv4Addr]) -> NodeNet {
        NodeNet {
            name: "node-a1".into(),
            pod_ips: pods.to_vec(),
            client_ip: Ipv4Addr::new(127, 0, 100, 1),
            apiserver: SocketAddrV4::new(Ipv4Addr::LOCALHOST, 6443),
        }
    }

    fn rendered(rules: &[(Hook, String)]) -> Vec<String> {
        rules
            .iter()
            .map(|(hook, rule)| format!("{}: {rule}", hook.chain()))
            .collect()
    }

    #[test]
    fn power_off_silences_addresses_and_sockets() {
        let n = node(&[Ipv4Addr::new(127, 5, 1, 1), Ipv4Addr::new(127, 5, 1, 2)]);
        let rules = rendered(&power_off_rules("N", &n));
        assert_eq!(
            rules,
            [
                "out: ip saddr { 127.5.1.1, 127.5.1.2, 127.0.100.1 } drop",
                "out: ip daddr { 127.5.1.1, 127.5.1.2, 127.0.100.1 } drop",
                "out: N drop",
            ]
        );
    }

    #[test]
    fn partition_keeps_the_node_to_itself() {
        let n = node(&[Ipv4Addr::new(127, 5, 1, 1)]);
        let rules = rendered(&partition_rules("N", &n));
        let pods = "{ 127.5.1.1 }";
        let reachable = "{ 127.5.1.1, 127.0.100.1, 127.0.0.1 }";
        assert_eq!(
            rules,
            [
                "out: N ip daddr 127.0.0.1 tcp dport 6443 drop".to_string(),
                format!("out: N ip daddr != {reachable} drop"),
                format!("out: ip saddr {pods} ip daddr != {reachable} drop"),
                "out: N return".to_string(),
                format!("out: ip daddr {pods} ip saddr != 127.0.100.1 drop"),
                format!("out: ip saddr 127.0.100.1 ip daddr != {pods} drop"),
                format!("in: ip daddr 127.0.0.1 N ip saddr != {pods} drop"),
                format!("in: ip daddr 127.0.0.1 ip saddr {pods} N return"),
                format!("in: ip daddr 127.0.0.1 ip saddr {pods} drop"),
            ]
        );
    }

    #[test]
    fn a_node_without_pods_is_still_cut() {
        let rules = rendered(&partition_rules("N", &node(&[])));
        assert!(rules.contains(&"out: N ip daddr != { 127.0.100.1, 127.0.0.1 } drop".into()));
        assert!(rules.contains(&"out: ip saddr 127.0.100.1 drop".into()));
    }

    #[test]
    fn chain_names_are_nft_identifiers() {
        assert_eq!(
            chain_name(NodeFault::Partition, "node-a1", Hook::Input),
            "part_node_a1_in"
        );
        assert_eq!(
            chain_name(NodeFault::PowerOff, "worker.2", Hook::Output),
            "off_worker_2_out"
        );
    }
}
