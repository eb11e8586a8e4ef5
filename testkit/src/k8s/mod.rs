//! A real Kubernetes control plane for tests and the demo, fake nodes, and process-backed pods.
//!
//! - [`ControlPlane`]: etcd + kube-apiserver (RBAC, ServiceAccount issuer and keys, static token
//!   identities), optionally kube-scheduler and kube-controller-manager with their own
//!   kubeconfigs. Binaries: Kubernetes v1.37.2 and etcd v3.6.16 built from Go modules by
//!   `scripts/k8s-bins.sh` (see [`k8s_bin_dir`]).
//! - [`FakeNodes`]: Node objects over zones with heartbeats (Leases and the Ready condition).
//! - [`Kubelet`]: runs the pods bound to those nodes as local `valkey-server` and `valkey-sidecar`
//!   processes, each pod on its own loopback IP, and reports their status like a kubelet.
//! - [`audit`]: API requests per client, verb and resource from the apiserver's audit log
//!   ([`ControlPlaneOptions::audit`]).
//!
//! All of it is async (tokio). Teardown is by `Drop`: drop the kubelet first (pod processes), then
//! the nodes (heartbeat), then the control plane (its processes and dirs); declaring them in the
//! order plane, nodes, kubelet gives exactly that. Processes also die with the test process
//! (`setpriv --pdeathsig KILL`, as for every harness process).
//!
//! ```no_run
//! use std::time::Duration;
//! use valkey_sidecar_testkit::k8s::{
//!     ControlPlane, ControlPlaneOptions, FakeNodes, FakeNodesOptions, Kubelet, KubeletOptions,
//! };
//!
//! # async fn demo() -> anyhow::Result<()> {
//! let plane = ControlPlane::start(ControlPlaneOptions::default()).await?;
//! let nodes = FakeNodes::start(plane.client(), FakeNodesOptions::default()).await?;
//! nodes.wait_ready(Duration::from_secs(30)).await?;
//! let kubelet = Kubelet::start(&plane, &nodes, KubeletOptions::default()).await?;
//! // Create pods with plane.client(); the scheduler binds them, the kubelet runs them.
//! kubelet.wait_ready("default", "valkey-0", Duration::from_secs(30)).await?;
//! # Ok(())
//! # }
//! ```

pub use audit::{AuditLog, Usage};
pub use bins::{
    K8S_BIN_DIR_ENV, SIDECAR_BIN_ENV, k8s_bin_dir, k8s_bin_dir_env, k8s_bin_dir_for, kubectl_bin,
    sidecar_bin,
};
pub use chart::helm_bin;
pub use control_plane::{
    ADMIN_USER, ControlPlane, ControlPlaneOptions, LIMITED_USER, SERVICE_CIDR, StartTimings,
};
pub use kubelet::{HookRun, Kubelet, KubeletOptions, MemoryUse, StartRecord, StopRecord};
pub use nodes::{FakeNode, FakeNodes, FakeNodesOptions, HOSTNAME_LABEL, REGION_LABEL, ZONE_LABEL};
pub use stage::{ROLE_LABEL, RoleWatch, Stage, StageOptions, holder_pod};
pub use util::{http_get, poll_until, process_alive};

pub mod audit;
pub mod chart;
pub mod follow;
pub mod netfault;
pub mod primaries;
pub mod shard;
pub mod slow_api;
pub mod smoke;
pub mod stage;
pub mod storage;
pub mod valkey;
pub mod writer;

mod bins;
mod control_plane;
mod diagnose;
mod kubeconfig;
mod kubelet;
mod nodes;
mod util;

use k8s_openapi::api::core::v1::Pod;

/// Whether the pod is Ready as the rest of Kubernetes sees it: its `Ready` condition is `True`
/// and it is not being deleted. A terminating pod may still report `Ready=True` (the kubelet
/// leaves the condition alone while it stops the containers), but EndpointSlices and the
/// disruption controller count it out from its `deletionTimestamp` on.
pub fn pod_is_ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && pod_condition(pod, "Ready") == Some(true)
}

/// The status of one of the pod's conditions, if present.
pub fn pod_condition(pod: &Pod, kind: &str) -> Option<bool> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| c.status == "True")
}
