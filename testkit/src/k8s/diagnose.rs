//! What a failed wait prints about the pods it waited for: each unsettled pod's Valkey view
//! (`ROLE`, and in cluster mode `CLUSTER NODES`) and the tail of its agent's log. CI keeps only
//! the test's output, so a flake there must explain itself in the failure message.

use k8s_openapi::api::core::v1::Pod;

use super::chart::label;
use super::stage::ROLE_LABEL;
use super::stage::Stage;

/// Agent log lines per unsettled pod: enough for the last decisions, short enough for CI's tail.
const AGENT_LINES: usize = 12;

impl Stage {
    /// Valkey's view and the agent's last lines for every pod that is not Ready and labelled.
    pub async fn diagnose_unsettled(&self) -> String {
        let pods = self.pod_objects().await.unwrap_or_default();
        let unsettled = |name: &String| {
            !pods
                .iter()
                .any(|p| p.metadata.name.as_ref() == Some(name) && settled(p))
        };
        self.pods
            .iter()
            .filter(|name| unsettled(name))
            .map(|name| self.diagnose(name))
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn diagnose(&self, pod: &str) -> String {
        let reply = |args: &[&str]| match self.cmd(pod, args) {
            Ok(v) => format!("{v:?}"),
            Err(e) => format!("({e:#})"),
        };
        // In replication mode this is Valkey's refusal, which says the mode too.
        let nodes = reply(&["CLUSTER", "NODES"]);
        let log = self
            .kubelet
            .container_log(&self.namespace, pod, "valkey-sidecar", AGENT_LINES);
        format!(
            "--- {pod}: ROLE {}\n{nodes}\n--- {pod} agent log:\n{log}",
            reply(&["ROLE"])
        )
    }

    /// Every agent's whole-log lines that contain any of `words`, each after its pod's name: the
    /// decisions of one kind (the Lease's, a keeper's) across the deployment, for a post-mortem.
    pub fn agent_lines(&self, words: &[&str]) -> String {
        let mut out = String::new();
        for pod in &self.pods {
            let log = self
                .kubelet
                .container_log(&self.namespace, pod, "valkey-sidecar", 100_000);
            for line in log.lines().filter(|l| words.iter().any(|w| l.contains(w))) {
                out.push_str(&format!("{pod}: {line}\n"));
            }
        }
        out
    }
}

/// Ready and labelled with a role: what [`Stage::wait_settled`] waits for on every pod.
pub(super) fn settled(p: &Pod) -> bool {
    super::pod_is_ready(p) && label(p, ROLE_LABEL).is_some()
}

impl Stage {
    /// How every container of this stage's namespace stopped so far: its preStop time, SIGTERM
    /// to exit, and for the agents their last log lines (the pods themselves may be gone).
    pub fn stops_report(&self) -> String {
        let stops = self.kubelet.stops();
        let first = stops.iter().map(|s| s.at).min();
        stops
            .iter()
            .filter(|s| s.namespace == self.namespace)
            .map(|s| {
                let at = first.map(|f| s.at.duration_since(f)).unwrap_or_default();
                let head = format!(
                    "--- {}/{} SIGTERM at +{at:?} after a {:?} preStop, exited in {:?} (graceful {})",
                    s.pod, s.container, s.pre_stop, s.took, s.graceful
                );
                match s.container == "valkey-sidecar" {
                    true => format!("{head}\n{}", s.log_tail),
                    false => head,
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}
