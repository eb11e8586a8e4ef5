//! Records in a format this agent does not know (`core::format`): refused as unreadable, counted,
//! logged and told in one Event on the agent's own pod per record and format.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use valkey_sidecar_core::format::{self, Unreadable};

use super::KubeError;
use super::events::{Event, EventType, Recorder};
use crate::runtime::metrics::Metrics;

/// Where a refusal is told. The default tells only the log.
#[derive(Clone, Default)]
pub struct FormatNotice {
    metrics: Option<Arc<Metrics>>,
    /// The Event's recorder and the agent's own pod.
    events: Option<(Recorder, ObjectReference)>,
    /// The records and formats told already (an Event once each, not once per read).
    told: Arc<Mutex<BTreeSet<(String, String)>>>,
}

impl FormatNotice {
    pub fn new(metrics: Arc<Metrics>, events: Option<(Recorder, ObjectReference)>) -> Self {
        FormatNotice {
            metrics: Some(metrics),
            events,
            told: Arc::default(),
        }
    }

    /// The Lease if its format may be read; else the refusal, told (`kind`: coordinator, shard).
    pub fn check(&self, lease: &Lease, kind: &'static str) -> Result<(), KubeError> {
        let annotations = lease.metadata.annotations.as_ref();
        let value = annotations.and_then(|a| a.get(format::ANNOTATION));
        let Err(why) = format::check(value.map(String::as_str)) else {
            return Ok(());
        };
        let name = lease.metadata.name.clone().unwrap_or_default();
        self.tell(kind, &name, &why);
        Err(KubeError::Format { name, why })
    }

    fn tell(&self, kind: &'static str, name: &str, why: &Unreadable) {
        if let Some(m) = &self.metrics {
            m.newer_format(kind);
        }
        let key = (name.to_owned(), why.to_string());
        let first = self
            .told
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key);
        if !first {
            return;
        }
        tracing::warn!(lease = %name, kind, reason = %why, "record not read");
        let Some((recorder, pod)) = self.events.clone() else {
            return;
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "RecordFormatUnknown".into(),
            note: Some(format!("Lease {name}: {why}")),
            action: "Read".into(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &pod).await {
                tracing::warn!(error = %e, "event not published");
            }
        });
    }
}

/// The annotation every record write carries.
pub fn stamp(annotations: &mut std::collections::BTreeMap<String, String>) {
    annotations.insert(format::ANNOTATION.to_owned(), format::FORMAT.to_string());
}
