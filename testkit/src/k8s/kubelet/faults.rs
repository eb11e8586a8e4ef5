//! Chaos on pods and nodes: signals, network faults between pods, and the node faults (power-off,
//! partition, freeze). See the kubelet module docs for what each one means.

use std::net::Ipv4Addr;
use std::sync::Arc;

use anyhow::Context;

use super::pod::PodRuntime;
use super::{Down, Kubelet, apiserver_addr};
use crate::Result;
use crate::k8s::netfault::{Cgroups, Cut, NetFaults, NodeFault, NodeNet, OBSERVER_IP};

impl Kubelet {
    /// SIGSTOP every process of the pod (probes then time out).
    pub fn pause(&self, namespace: &str, name: &str) -> Result<()> {
        self.pod(namespace, name)?.signal_all("STOP")
    }

    /// SIGCONT after [`Self::pause`].
    pub fn resume(&self, namespace: &str, name: &str) -> Result<()> {
        self.pod(namespace, name)?.signal_all("CONT")
    }

    /// The node loses power. First its addresses go silent — packets from and to its pods' IPs
    /// and its InternalIP, and everything its pods' sockets send, are dropped — then every
    /// process of its pods is killed (SIGKILL), so peers and clients see no reset but hang until
    /// their own timeouts. Its heartbeat stops and the kubelet stops acting for it (no restarts,
    /// no status, deletions stay pending) until [`Self::power_on`].
    pub fn power_off(&self, node: &str) -> Result<()> {
        let (faults, cgroups) = self.faults()?;
        let net = self.node_net(node)?;
        self.shared.go_down(node, Down::PowerOff)?;
        if let Err(e) = faults.fault_node(cgroups, NodeFault::PowerOff, &net) {
            self.shared.come_up(node, Down::PowerOff)?;
            return Err(e);
        }
        cgroups.kill_node(node)?;
        for pod in self.shared.pods_on(node) {
            pod.reap();
        }
        Ok(())
    }

    /// Power is back: the node's addresses work again, its heartbeat resumes and its containers
    /// start again at once, as after a reboot (the crash-loop back-off is forgotten; `emptyDir`
    /// volumes are kept).
    pub fn power_on(&self, node: &str) -> Result<()> {
        let (faults, _) = self.faults()?;
        faults.clear_node(NodeFault::PowerOff, node)?;
        for pod in self.shared.pods_on(node) {
            pod.rebooted();
        }
        self.shared.come_up(node, Down::PowerOff)
    }

    /// Partitions the node from everything else: its processes keep running, its pods reach
    /// only the node's pod IPs, its InternalIP ([`Self::node_client_ip`]) and the observer
    /// ([`Self::observer_ip`]); nothing else reaches its pods (other pods, the test process, the
    /// apiserver's clients) and its pods do not reach the apiserver. Its heartbeat stops and the
    /// kubelet stops acting for it until [`Self::heal_node`] (a real kubelet would keep probing
    /// and restarting locally).
    pub fn partition_node(&self, node: &str) -> Result<()> {
        let (faults, cgroups) = self.faults()?;
        let net = self.node_net(node)?;
        self.shared.go_down(node, Down::Partition)?;
        if let Err(e) = faults.fault_node(cgroups, NodeFault::Partition, &net) {
            self.shared.come_up(node, Down::Partition)?;
            return Err(e);
        }
        Ok(())
    }

    /// Ends [`Self::partition_node`]: the node's network is whole, heartbeat and kubelet resume.
    pub fn heal_node(&self, node: &str) -> Result<()> {
        let (faults, _) = self.faults()?;
        faults.clear_node(NodeFault::Partition, node)?;
        self.shared.come_up(node, Down::Partition)
    }

    /// SIGSTOP every process of the node's pods; its heartbeat stops and the kubelet stops acting
    /// for it until [`Self::thaw_node`].
    pub fn freeze_node(&self, node: &str) -> Result<()> {
        self.shared.go_down(node, Down::Freeze)?;
        self.signal_node(node, "STOP")
    }

    /// SIGCONT every process of the node's pods; heartbeat and kubelet resume.
    pub fn thaw_node(&self, node: &str) -> Result<()> {
        self.signal_node(node, "CONT")?;
        self.shared.come_up(node, Down::Freeze)
    }

    fn signal_node(&self, node: &str, signal: &str) -> Result<()> {
        for pod in self.shared.pods_on(node) {
            pod.signal_all(signal)?;
        }
        Ok(())
    }

    /// The node's InternalIP (`127.0.100.x`; nothing listens there). A test client bound to it as
    /// its source address is on that node: in [`Self::partition_node`] it still reaches the
    /// node's pods, and only them.
    pub fn node_client_ip(&self, node: &str) -> Result<Ipv4Addr> {
        let ip = self
            .shared
            .host_ips
            .get(node)
            .with_context(|| format!("{node} is not a node of this kubelet"))?;
        ip.parse()
            .with_context(|| format!("the InternalIP of {node} ({ip}) is not IPv4"))
    }

    /// A loopback address no pod or node uses; a client bound to it is exempt from every network
    /// fault (pod cuts and node faults alike), for checkers that must see both sides of a
    /// partition.
    pub fn observer_ip(&self) -> Ipv4Addr {
        OBSERVER_IP
    }

    /// Cuts the network between pod `a` and each of `others` (both directions), as a partition
    /// would: their connections hang, everything else still works.
    pub fn partition(&self, namespace: &str, a: &str, others: &[&str]) -> Result<()> {
        let (faults, cgroups) = self.faults()?;
        let a = self.pod(namespace, a)?;
        for other in others {
            let b = self.pod(namespace, other)?;
            for (from, to) in [(&a, &b), (&b, &a)] {
                let cut = Cut {
                    from_uid: from.uid.clone(),
                    to: to.ip,
                    port: None,
                };
                faults.drop(cgroups, &cut)?;
            }
        }
        Ok(())
    }

    /// Cuts the pod off from the apiserver (its requests hang); pods still reach each other.
    pub fn cut_from_apiserver(&self, namespace: &str, pod: &str) -> Result<()> {
        let (faults, cgroups) = self.faults()?;
        let api = apiserver_addr(&self.shared.url)?;
        let cut = Cut {
            from_uid: self.pod(namespace, pod)?.uid.clone(),
            to: *api.ip(),
            port: Some(api.port()),
        };
        faults.drop(cgroups, &cut)
    }

    /// Throttles what pod `from` sends from its port `port` to pod `to` (e.g. a primary's
    /// replication stream to one replica) to `bytes_per_second`.
    pub fn throttle(
        &self,
        namespace: &str,
        (from, port): (&str, u16),
        to: &str,
        bytes_per_second: u64,
    ) -> Result<()> {
        let (faults, cgroups) = self.faults()?;
        let from = self.pod(namespace, from)?;
        let to = self.pod(namespace, to)?;
        faults.throttle(cgroups, (&from.uid, port), to.ip, bytes_per_second)
    }

    /// Removes every network fault between pods ([`Self::partition`],
    /// [`Self::cut_from_apiserver`], [`Self::throttle`]). Node faults stay until their own undo.
    pub fn heal_network(&self) -> Result<()> {
        self.faults()?.0.heal()
    }

    pub(super) fn faults(&self) -> Result<(&NetFaults, &Cgroups)> {
        let (faults, cgroups) =
            self.shared.faults.as_ref().context(
                "the kubelet runs without network faults (KubeletOptions::network_faults)",
            )?;
        Ok((faults, cgroups))
    }

    /// What the node faults need to know about `node`.
    fn node_net(&self, node: &str) -> Result<NodeNet> {
        let pods: Vec<Arc<PodRuntime>> = self.shared.pods_on(node);
        Ok(NodeNet {
            name: node.to_owned(),
            pod_ips: pods.iter().map(|p| p.ip).collect(),
            client_ip: self.node_client_ip(node)?,
            apiserver: apiserver_addr(&self.shared.url)?,
        })
    }
}
