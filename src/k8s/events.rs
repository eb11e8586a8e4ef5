//! Events through the core `v1` API. kube-runtime's recorder writes `events.k8s.io/v1`, which the
//! built-in `edit`/`admin` roles may write only from Kubernetes 1.34: a namespace admin on an
//! older cluster could not grant it, so the chart's namespace profile would not install. The core
//! API is the same store (`kubectl describe` and `events.k8s.io` readers see these Events) and
//! every supported version lets a namespace admin grant it.

use k8s_openapi::api::core::v1::{Event as CoreEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;
pub use kube::runtime::events::{Event, EventType, Reporter};

/// A reference to a pod, for the Events about it.
pub fn pod_reference(name: &str, namespace: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        uid,
        ..ObjectReference::default()
    }
}

/// Publishes Events about objects, as one reporter (the agent in one pod).
#[derive(Clone)]
pub struct Recorder {
    client: kube::Client,
    reporter: Reporter,
}

impl Recorder {
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self { client, reporter }
    }

    /// Creates one Event about `regarding` in its namespace (Events are rare here — hand-overs,
    /// role changes, data loss — so each is its own object, without series).
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api: Api<CoreEvent> = Api::namespaced(self.client.clone(), namespace);
        let object = event_object(&self.reporter, event, regarding, Timestamp::now());
        api.create(&PostParams::default(), &object)
            .await
            .map(|_| ())
    }
}

/// The Event object (a name unique per object and instant, as kube-runtime names them).
fn event_object(
    reporter: &Reporter,
    event: &Event,
    regarding: &ObjectReference,
    now: Timestamp,
) -> CoreEvent {
    let object = regarding.name.as_deref().unwrap_or("object");
    CoreEvent {
        metadata: ObjectMeta {
            name: Some(format!("{object}.{:x}", now.as_nanosecond())),
            namespace: regarding.namespace.clone(),
            ..ObjectMeta::default()
        },
        involved_object: regarding.clone(),
        reason: Some(event.reason.clone()),
        message: event.note.clone(),
        type_: Some(type_name(&event.type_).into()),
        action: Some(event.action.clone()),
        related: event.secondary.clone(),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        source: Some(EventSource {
            component: Some(reporter.controller.clone()),
            host: None,
        }),
        reporting_component: Some(reporter.controller.clone()),
        reporting_instance: reporter.instance.clone(),
        ..CoreEvent::default()
    }
}

fn type_name(t: &EventType) -> &'static str {
    match t {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_names_its_object_reason_and_reporter() {
        let reporter = Reporter {
            controller: "valkey-sidecar".into(),
            instance: Some("v-0-0".into()),
        };
        let regarding = ObjectReference {
            kind: Some("Pod".into()),
            name: Some("v-0-0".into()),
            namespace: Some("ns".into()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "ShardDataLost".into(),
            note: Some("gone".into()),
            action: "Promote".into(),
            secondary: None,
        };
        let object = event_object(&reporter, &event, &regarding, Timestamp::UNIX_EPOCH);
        assert_eq!(object.metadata.name.as_deref(), Some("v-0-0.0"));
        assert_eq!(object.metadata.namespace.as_deref(), Some("ns"));
        assert_eq!(object.type_.as_deref(), Some("Warning"));
        assert_eq!(object.reason.as_deref(), Some("ShardDataLost"));
        assert_eq!(object.message.as_deref(), Some("gone"));
        assert_eq!(object.reporting_instance.as_deref(), Some("v-0-0"));
        assert_eq!(object.involved_object, regarding);
    }
}
