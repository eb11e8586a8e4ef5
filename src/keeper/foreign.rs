//! A shard record naming a pod that exists but is no member of this pod's shard: forged with a
//! stolen agent token where the admission policy is off, or written by another deployment. The
//! keeper never follows it (no `REPLICAOF` to that pod, see `Keeper::member_ip`); this says so,
//! once per pod named, in the log, a counter and a Warning Event on the agent's own pod.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Api;

use super::Keeper;
use crate::kube::events::{Event, EventType};

/// The Event's reason.
pub(super) const REASON: &str = "ForeignShardRecord";

impl Keeper {
    /// The recorded primary `pod` is no member of the shard. `reported`: the pod last reported.
    pub(super) async fn report_foreign(&self, pod: &str, reported: &mut Option<String>) {
        if reported.as_deref() == Some(pod) {
            return;
        }
        // A pod that does not exist is most likely being recreated: nothing to report.
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let Ok(Some(_)) = crate::kube::bounded(self.api_limit(), pods.get_opt(pod)).await else {
            return;
        };
        *reported = Some(pod.to_owned());
        tracing::warn!(
            pod,
            "the shard record names a pod outside my shard: not following it"
        );
        self.metrics.shard_record("foreign_primary");
        self.publish_foreign(pod).await;
    }

    async fn publish_foreign(&self, pod: &str) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        let event = Event {
            type_: EventType::Warning,
            reason: REASON.into(),
            note: Some(format!(
                "the shard record names {pod}, which is no member of this shard: \
                 ignored, no Valkey replicates from it"
            )),
            action: "FollowRecord".into(),
            secondary: None,
        };
        let reference = self.own_reference();
        let sent = recorder.publish(&event, &reference);
        let result = match crate::kube::bounded(self.api_limit(), sent).await {
            Ok(()) => "ok",
            Err(e) => {
                tracing::warn!(error = %e, "event not published");
                e.kind()
            }
        };
        self.metrics.event(REASON, result);
    }

    /// This agent's pod, which the Events are about.
    fn own_reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(self.pod.clone()),
            namespace: Some(self.namespace.clone()),
            uid: self.pod_uid.clone(),
            ..ObjectReference::default()
        }
    }
}
