//! One `coordination.k8s.io/v1` Lease read and written with optimistic concurrency: what the
//! coordinator's Lease (`k8s::lease`) and the shard records (`k8s::record`) share. Reads
//! refuse a Lease of a newer format and learn the owner's UID; writes set the owner (so the Lease
//! goes with it, `k8s::owner`), create when there is nothing to replace, and replace only the
//! `resourceVersion` they were based on (409 when someone wrote in between). Every call is
//! bounded: by the configured timeout, or by the bound a write is given.

use std::time::Duration;

use futures::stream::{BoxStream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};

use super::KubeError;
use super::format::FormatNotice;
use super::owner::{LeaseOwner, for_write};

/// The Lease object behind a client.
#[derive(Clone)]
pub struct LeaseObject {
    api: Api<Lease>,
    name: String,
    timeout: Duration,
    /// What the format notice calls it ("coordinator", "shard").
    kind: &'static str,
    owner: Option<LeaseOwner>,
    notice: FormatNotice,
    /// Whether [`LeaseObject::changes`] watches (`SIDECAR_LEASE_WATCH`).
    watch: bool,
}

impl LeaseObject {
    pub fn new(
        client: kube::Client,
        namespace: &str,
        name: String,
        timeout: Duration,
        kind: &'static str,
    ) -> LeaseObject {
        LeaseObject {
            api: Api::namespaced(client, namespace),
            name,
            timeout,
            kind,
            owner: None,
            notice: FormatNotice::default(),
            watch: true,
        }
    }

    /// `false`: [`LeaseObject::changes`] never delivers anything, so its followers read the Lease
    /// every retry period, as they do while a watch is broken.
    pub fn set_watch(&mut self, watch: bool) {
        self.watch = watch;
    }

    pub fn set_notice(&mut self, notice: FormatNotice) {
        self.notice = notice;
    }

    pub fn set_owner(&mut self, owner: Option<LeaseOwner>) {
        self.owner = owner;
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The Lease; `None` when it does not exist. One of a newer format is an error, as an
    /// unreadable one: nobody takes over, renews or moves what it cannot read.
    pub async fn get(&self) -> Result<Option<Lease>, KubeError> {
        self.get_within(self.timeout).await
    }

    /// [`LeaseObject::get`] with its own bound (a holder's read after a failed renewal may take a
    /// renew deadline).
    pub async fn get_within(&self, limit: Duration) -> Result<Option<Lease>, KubeError> {
        let lease = super::bounded(limit, self.api.get_opt(&self.name)).await?;
        if let Some(l) = &lease {
            self.accept(l)?;
        }
        Ok(lease)
    }

    /// What every Lease read or delivered by a watch goes through: refused when of a newer
    /// format, and its owner's UID learnt.
    pub fn accept(&self, lease: &Lease) -> Result<(), KubeError> {
        self.notice.check(lease, self.kind)?;
        self.owner.iter().for_each(|o| o.learn(lease));
        Ok(())
    }

    /// The Lease's changes from a watch on its name (one object, so a follower costs the
    /// apiserver a watch, not a read every retry period), re-established with backoff; errors
    /// are items, so the caller knows when it is not watching.
    pub fn changes(&self) -> BoxStream<'static, Result<watcher::Event<Lease>, watcher::Error>> {
        if !self.watch {
            return futures::stream::pending().boxed();
        }
        let config = super::watch_config().fields(&format!("metadata.name={}", self.name));
        watcher(self.api.clone(), config).default_backoff().boxed()
    }

    /// Creates (`creating`) or replaces the Lease `build` makes, given the owner reference to
    /// carry; returns it as written.
    pub async fn put(
        &self,
        creating: bool,
        build: impl FnOnce(Option<OwnerReference>) -> Lease,
    ) -> Result<Lease, KubeError> {
        self.put_within(self.timeout, creating, build).await
    }

    /// [`LeaseObject::put`] with its own bound on the write (a holder's renewal may take a renew
    /// deadline: `core::lease::Candidate::write_limit_ms`).
    pub async fn put_within(
        &self,
        limit: Duration,
        creating: bool,
        build: impl FnOnce(Option<OwnerReference>) -> Lease,
    ) -> Result<Lease, KubeError> {
        let owner = for_write(self.owner.as_ref(), creating, self.timeout).await;
        let lease = build(owner);
        let params = PostParams::default();
        let write = async {
            if creating {
                self.api.create(&params, &lease).await
            } else {
                self.api.replace(&self.name, &params, &lease).await
            }
        };
        super::bounded(limit, write).await
    }
}
