//! Graceful pod termination, in the kubelet's order (`killContainersWithSyncResult` with the
//! sidecar `terminationOrdering` of Kubernetes ≥ 1.29, KEP-753):
//!
//! 1. At deletion every running container, main and sidecar alike, starts its own `preStop` hook
//!    (all at once; a container without one goes straight to step 2).
//! 2. A main container (or a regular init container still running) gets SIGTERM as soon as its
//!    hook returned. A native sidecar waits, after its hook, for its turn: until every main
//!    container has exited and so has every sidecar after it in `initContainers` — sidecars stop
//!    in reverse order. The wait ends at the latest when the grace period does.
//! 3. SIGKILL after what is left of the grace period (at least [`MIN_TERM_GRACE`], as the kubelet
//!    gives every container a minimal window), then the pod object is removed (delete with grace
//!    0, only this incarnation: uid precondition).
//!
//! So a sidecar's `preStop` does *not* wait for the main containers (it runs at deletion, like
//! the kubelet's); only its SIGTERM does.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Preconditions};
use tokio::sync::watch;

use super::container::{Class, ContainerRuntime};
use super::pod::{PodRuntime, run_hook};
use super::{Shared, StopRecord};
use crate::Result;
use crate::net::lock;

/// Log lines kept of a stopped container ([`StopRecord::log_tail`]).
const STOP_LOG_LINES: usize = 30;

/// The kubelet's minimum time for SIGTERM after a preStop hook used up the grace period.
const MIN_TERM_GRACE: Duration = Duration::from_secs(2);

pub(super) async fn terminate(shared: &Shared, pod: &PodRuntime, object: &Pod) -> Result<()> {
    let grace = grace_period(object);
    let deadline = Instant::now() + grace;
    let running: Vec<Arc<ContainerRuntime>> = pod
        .containers()
        .into_iter()
        .filter(|c| c.pid().is_some())
        .collect();
    let turns = Turns::new(&running);
    let stops = running
        .into_iter()
        .map(|c| stop_container(shared, pod, c, grace, deadline, &turns));
    join_all(stops).await;
    // A node that went down meanwhile finalises nothing: the pod stays Terminating until it is
    // back, as with a real dead node.
    while shared.is_down(&pod.node) {
        tokio::time::sleep(shared.opts.sync_period).await;
    }
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &pod.namespace);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(pod.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&pod.name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e).context("removing the pod object"),
    }
}

/// `deletionGracePeriodSeconds` (set by the delete call), else the spec's, else 30 s.
fn grace_period(object: &Pod) -> Duration {
    let secs = object
        .metadata
        .deletion_grace_period_seconds
        .or_else(|| object.spec.as_ref()?.termination_grace_period_seconds)
        .unwrap_or(30);
    Duration::from_secs(u64::try_from(secs).unwrap_or(0))
}

/// When each container may get SIGTERM: the names that must have exited first.
struct Turns {
    exited: watch::Sender<HashSet<String>>,
    waits_for: HashMap<String, Vec<String>>,
}

impl Turns {
    /// `running` in spec order (init containers first). Only running containers are waited for.
    fn new(running: &[Arc<ContainerRuntime>]) -> Self {
        let names = |class: Class| -> Vec<String> {
            let of_class = running.iter().filter(|c| c.class == class);
            of_class.map(|c| c.name.clone()).collect()
        };
        let mains = names(Class::Main);
        let sidecars = names(Class::Sidecar);
        let waits_for = sidecars
            .iter()
            .enumerate()
            .map(|(i, name)| {
                let later = sidecars.iter().skip(i + 1).cloned();
                (name.clone(), mains.iter().cloned().chain(later).collect())
            })
            .collect();
        Self {
            exited: watch::Sender::new(HashSet::new()),
            waits_for,
        }
    }

    /// Waits until it is `name`'s turn, or until `deadline`.
    async fn wait(&self, name: &str, deadline: Instant) {
        let Some(needs) = self.waits_for.get(name) else {
            return;
        };
        let mut exited = self.exited.subscribe();
        let turn = exited.wait_for(|done| needs.iter().all(|n| done.contains(n)));
        // Err: the grace period is over; SIGTERM now, SIGKILL soon.
        let _ = tokio::time::timeout_at(deadline.into(), turn).await;
    }

    fn exited(&self, name: &str) {
        self.exited.send_modify(|done| {
            done.insert(name.to_owned());
        });
    }
}

/// One container's part of [`terminate`]: its preStop hook, its turn, then SIGTERM with what is
/// left of the grace period (at least [`MIN_TERM_GRACE`]). Records how it stopped.
async fn stop_container(
    shared: &Shared,
    pod: &PodRuntime,
    c: Arc<ContainerRuntime>,
    grace: Duration,
    deadline: Instant,
    turns: &Turns,
) {
    let hooked = Instant::now();
    if let Some(handler) = c.spec.lifecycle.as_ref().and_then(|l| l.pre_stop.as_ref()) {
        run_hook(shared, pod, &c, "preStop", handler, grace).await;
    }
    let pre_stop = hooked.elapsed();
    turns.wait(&c.name, deadline).await;
    let term_grace = deadline
        .saturating_duration_since(Instant::now())
        .max(MIN_TERM_GRACE);
    let at = Instant::now();
    let stopping = Arc::clone(&c);
    let stopped =
        tokio::task::spawn_blocking(move || stopping.terminate_blocking(term_grace)).await;
    let took = at.elapsed();
    turns.exited(&c.name);
    let graceful = match stopped {
        Ok(graceful) => graceful,
        Err(e) => {
            eprintln!("valkey-testkit kubelet: stopping {}: {e}", c.label);
            return;
        }
    };
    if !graceful {
        eprintln!(
            "valkey-testkit kubelet: {} ignored SIGTERM until the grace period ended; killed",
            c.label
        );
    }
    lock(&shared.stops).push(StopRecord {
        namespace: pod.namespace.clone(),
        pod: pod.name.clone(),
        container: c.name.clone(),
        graceful,
        at,
        took,
        pre_stop,
        log_tail: c.log_tail(STOP_LOG_LINES),
    });
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use k8s_openapi::api::core::v1::Container;

    use super::*;
    use crate::k8s::kubelet::container::Setup;
    use crate::k8s::kubelet::spec::Kind;

    fn container(name: &str, class: Class) -> Arc<ContainerRuntime> {
        let setup = Setup {
            spec: Container {
                name: name.into(),
                ..Container::default()
            },
            class,
            kind: Kind::Pause,
            env: Vec::new(),
            label: name.into(),
            program: None,
            cgroup: None,
            cpu: None,
            memory: None,
        };
        Arc::new(ContainerRuntime::new(setup, Ipv4Addr::LOCALHOST).unwrap())
    }

    #[tokio::test]
    async fn sidecars_go_after_the_main_containers_in_reverse_order() {
        let running = [
            container("first", Class::Sidecar),
            container("second", Class::Sidecar),
            container("valkey", Class::Main),
            container("other", Class::Main),
        ];
        let turns = Turns::new(&running);
        assert_eq!(turns.waits_for["first"], ["valkey", "other", "second"]);
        assert_eq!(turns.waits_for["second"], ["valkey", "other"]);
        assert!(!turns.waits_for.contains_key("valkey"));

        let far = Instant::now() + Duration::from_secs(30);
        let second = turns.wait("second", far);
        tokio::pin!(second);
        turns.exited("valkey");
        let early = tokio::time::timeout(Duration::from_millis(50), &mut second).await;
        assert!(early.is_err(), "still waiting for `other`");
        turns.exited("other");
        tokio::time::timeout(Duration::from_secs(1), second)
            .await
            .unwrap();
        // The grace period ends the wait whatever has exited.
        let soon = Instant::now() + Duration::from_millis(20);
        tokio::time::timeout(Duration::from_secs(1), turns.wait("first", soon))
            .await
            .unwrap();
    }
}
