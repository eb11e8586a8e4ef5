//! The per-shard primary record of replication mode (`core::replication::ShardRecord`), stored on a
//! `coordination.k8s.io/v1` Lease `<cluster>-<shard>-primary`: `holderIdentity` is the pod that may
//! be primary, the annotations carry the epoch and the last promoted pod.
//!
//! Every write is a compare-and-swap on `resourceVersion` (409 when someone wrote in between);
//! reads are plain GETs, which the apiserver serves from etcd with a quorum read, so a read sent
//! after a write always reflects it.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::ObjectMeta;
use kube::runtime::watcher;
use valkey_sidecar_core::replication::ShardRecord;

use super::KubeError;
use super::format::{FormatNotice, stamp};
use super::lease_object::LeaseObject;
use super::owner::LeaseOwner;

/// One shard's record, read and written with optimistic concurrency ([`LeaseObject`]).
#[derive(Clone)]
pub struct RecordClient {
    lease: LeaseObject,
    cluster: String,
    lease_seconds: i32,
}

impl RecordClient {
    /// The client of `cluster`'s record for `shard` (`<cluster>-<shard>-primary`).
    pub fn new(
        client: kube::Client,
        namespace: &str,
        (cluster, shard): (&str, &str),
        timeout: Duration,
        lease: Duration,
    ) -> RecordClient {
        let name = ShardRecord::lease_name(cluster, shard);
        RecordClient {
            lease: LeaseObject::new(client, namespace, name, timeout, "shard"),
            cluster: cluster.to_owned(),
            lease_seconds: i32::try_from(lease.as_secs().max(1)).unwrap_or(i32::MAX),
        }
    }

    /// Where a record of an unknown format is told.
    pub fn telling(mut self, notice: FormatNotice) -> RecordClient {
        self.lease.set_notice(notice);
        self
    }

    /// Whether [`RecordClient::watch`] watches (`SIDECAR_LEASE_WATCH`; [`LeaseObject::set_watch`]).
    pub fn watching(mut self, watch: bool) -> RecordClient {
        self.lease.set_watch(watch);
        self
    }

    /// The owner to put on the Lease.
    pub fn owned_by(mut self, owner: Option<LeaseOwner>) -> RecordClient {
        self.lease.set_owner(owner);
        self
    }

    pub fn name(&self) -> &str {
        self.lease.name()
    }

    /// The record each time the Lease changes (from a watch, re-established with backoff), `None`
    /// when it was deleted, or the watch's error. A watch may lag: what it says moved is read
    /// before anything is decided on it.
    pub fn watch(&self) -> BoxStream<'static, Result<Option<ShardRecord>, watcher::Error>> {
        self.lease
            .changes()
            .filter_map(|event| async move {
                match event {
                    Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)) => {
                        Some(Ok(Some(record_of(&l))))
                    }
                    Ok(watcher::Event::Delete(_)) => Some(Ok(None)),
                    Ok(watcher::Event::Init | watcher::Event::InitDone) => None,
                    Err(e) => Some(Err(e)),
                }
            })
            .boxed()
    }

    /// The record; `None` when the Lease does not exist. A record of a newer format is an error,
    /// as an unreadable one: nobody claims, renews or moves what it cannot read.
    pub async fn read(&self) -> Result<Option<ShardRecord>, KubeError> {
        let lease = self.lease.get().await?;
        Ok(lease.as_ref().map(record_of))
    }

    /// Writes `rec`: creates the Lease when `rec.version` is empty, else replaces the version
    /// `rec` was read at (409 if it changed since). Returns the record as written.
    pub async fn write(&self, rec: &ShardRecord) -> Result<ShardRecord, KubeError> {
        let creating = rec.version.is_empty();
        let written = self
            .lease
            .put(creating, |owner| self.lease_of(rec, owner))
            .await?;
        Ok(record_of(&written))
    }

    /// Moves the record to `holder` at `epoch` only while it still shows `expect_holder` at
    /// `expect_epoch` (the old holder may renew meanwhile, which only changes the version).
    /// `Ok(false)`: someone else moved it.
    pub async fn move_to(
        &self,
        expect_holder: &str,
        expect_epoch: u64,
        holder: &str,
        epoch: u64,
    ) -> Result<bool, KubeError> {
        for _ in 0..5 {
            let Some(current) = self.read().await? else {
                return Ok(false);
            };
            if current.recorded_primary() != Some(expect_holder) || current.epoch != expect_epoch {
                return Ok(false);
            }
            let next = ShardRecord {
                lease_ms: None,
                holder: Some(holder.to_owned()),
                primary: Some(holder.to_owned()),
                epoch,
                version: current.version,
            };
            match self.write(&next).await {
                Ok(_) => return Ok(true),
                Err(e) if e.kind() == "conflict" => continue,
                Err(e) => return Err(e),
            }
        }
        Ok(false)
    }

    fn lease_of(&self, rec: &ShardRecord, owner: Option<OwnerReference>) -> Lease {
        let now = MicroTime(jiff::Timestamp::now());
        let mut annotations = BTreeMap::new();
        annotations.insert(
            ShardRecord::EPOCH_ANNOTATION.to_owned(),
            rec.epoch.to_string(),
        );
        if let Some(p) = &rec.primary {
            annotations.insert(ShardRecord::PRIMARY_ANNOTATION.to_owned(), p.clone());
        }
        stamp(&mut annotations);
        // Labelled so the coordinator can watch every record of its cluster with one selector.
        let labels = BTreeMap::from([
            (
                ShardRecord::KIND_LABEL.to_owned(),
                ShardRecord::KIND.to_owned(),
            ),
            (ShardRecord::CLUSTER_LABEL.to_owned(), self.cluster.clone()),
        ]);
        Lease {
            metadata: ObjectMeta {
                name: Some(self.name().to_owned()),
                labels: Some(labels),
                owner_references: owner.map(|o| vec![o]),
                resource_version: Some(rec.version.clone()).filter(|v| !v.is_empty()),
                annotations: Some(annotations),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: rec.holder.clone().filter(|h| !h.is_empty()),
                lease_duration_seconds: Some(self.lease_seconds),
                renew_time: Some(now),
                ..LeaseSpec::default()
            }),
        }
    }
}

/// The record a Lease carries. A missing or unreadable epoch reads as 0, below every real epoch.
pub fn record_of(lease: &Lease) -> ShardRecord {
    let spec = lease.spec.clone().unwrap_or_default();
    let annotations = lease.metadata.annotations.clone().unwrap_or_default();
    ShardRecord {
        lease_ms: lease_ms_of(&spec),
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        primary: annotations
            .get(ShardRecord::PRIMARY_ANNOTATION)
            .filter(|p| !p.is_empty())
            .cloned(),
        epoch: annotations
            .get(ShardRecord::EPOCH_ANNOTATION)
            .and_then(|e| e.parse().ok())
            .unwrap_or(0),
        version: lease.metadata.resource_version.clone().unwrap_or_default(),
    }
}

/// `leaseDurationSeconds` in ms; a negative or missing duration reads as unknown.
fn lease_ms_of(spec: &LeaseSpec) -> Option<u64> {
    let seconds = u64::try_from(spec.lease_duration_seconds?).ok()?;
    Some(seconds.saturating_mul(1000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_survives_the_round_trip_through_a_lease() {
        let client_free = ShardRecord {
            lease_ms: None,
            holder: Some("valkey-0-1".into()),
            primary: Some("valkey-0-1".into()),
            epoch: 7,
            version: "42".into(),
        };
        let lease = Lease {
            metadata: ObjectMeta {
                resource_version: Some("42".into()),
                annotations: Some(BTreeMap::from([
                    ("valkey.io/epoch".to_owned(), "7".to_owned()),
                    ("valkey.io/primary".to_owned(), "valkey-0-1".to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("valkey-0-1".into()),
                ..LeaseSpec::default()
            }),
        };
        assert_eq!(record_of(&lease), client_free);
    }

    #[test]
    fn a_released_lease_keeps_its_epoch_and_last_primary() {
        let lease = Lease {
            metadata: ObjectMeta {
                annotations: Some(BTreeMap::from([
                    ("valkey.io/epoch".to_owned(), "3".to_owned()),
                    ("valkey.io/primary".to_owned(), "a".to_owned()),
                ])),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(String::new()),
                ..LeaseSpec::default()
            }),
        };
        let rec = record_of(&lease);
        assert_eq!(rec.holder(), None);
        assert_eq!(rec.recorded_primary(), Some("a"));
        assert_eq!(rec.epoch, 3);
    }
}
