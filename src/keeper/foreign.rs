//! Records the keeper does not follow, said once per pod named in the log, a counter and a
//! Warning Event on the agent's own pod:
//! - a record naming a pod that exists but is no member of this pod's shard (forged with a stolen
//!   agent token where the admission policy is off, or written by another deployment): no
//!   `REPLICAOF` to that pod ever (`Keeper::member_ip`);
//! - a record naming a successor this primary may not follow with its data: not master, not
//!   answering, or not continuing its stream (`core::replication::NOT_FOLLOWING`) — a record no
//!   promotion carried out, e.g. forged with any agent's token within the admission policy.

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::Api;
use valkey_sidecar_core::replication::{LocalAction, LocalView, NOT_FOLLOWING, ShardRecord};

use super::Keeper;
use crate::k8s::events::{Event, EventType};

/// The Event's reason.
pub(super) const REASON: &str = "ForeignShardRecord";
/// The Event's reason for a successor not followed.
pub(super) const UNFOLLOWED: &str = "ShardRecordNotFollowed";

impl Keeper {
    /// The recorded primary `pod` is no member of the shard. `reported`: the pod last reported.
    pub(super) async fn report_foreign(&self, pod: &str, reported: &mut Option<String>) {
        if reported.as_deref() == Some(pod) {
            return;
        }
        // A pod that does not exist is most likely being recreated: nothing to report.
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), &self.namespace);
        let Ok(Some(_)) = crate::k8s::bounded(self.api_limit(), pods.get_opt(pod)).await else {
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
        let note = format!(
            "the shard record names {pod}, which is no member of this shard: \
             ignored, no Valkey replicates from it"
        );
        self.warn(REASON, note).await;
    }

    /// `action` refuses to follow the recorded successor: said once per successor named.
    pub(super) async fn report_unfollowed(
        &self,
        action: &LocalAction,
        view: &LocalView,
        reported: &mut Option<String>,
    ) {
        if !action.reason().contains(NOT_FOLLOWING) {
            return;
        }
        let record = view.record.as_ref().and_then(|s| s.record.as_ref());
        let Some(named) = record.and_then(ShardRecord::recorded_primary) else {
            return;
        };
        if reported.as_deref() == Some(named) {
            return;
        }
        *reported = Some(named.to_owned());
        let reason = action.reason();
        tracing::warn!(pod = named, %reason, "the shard record names a successor I do not follow");
        self.metrics.shard_record("not_followed");
        let note = format!("{reason}; my Valkey stays fenced with its data");
        self.warn(UNFOLLOWED, note).await;
    }

    /// A Warning Event on this agent's pod.
    async fn warn(&self, reason: &'static str, note: String) {
        let Some(recorder) = &self.recorder else {
            return;
        };
        let event = Event {
            type_: EventType::Warning,
            reason: reason.into(),
            note: Some(note),
            action: "FollowRecord".into(),
            secondary: None,
        };
        let reference = self.own_reference();
        let sent = recorder.publish(&event, &reference);
        let result = match crate::k8s::bounded(self.api_limit(), sent).await {
            Ok(()) => "ok",
            Err(e) => {
                tracing::warn!(error = %e, "event not published");
                e.kind()
            }
        };
        self.metrics.event(reason, result);
    }

    /// This agent's pod, which the Events are about.
    pub(super) fn own_reference(&self) -> ObjectReference {
        crate::k8s::events::pod_reference(&self.pod, &self.namespace, self.pod_uid.clone())
    }
}
