//! The election against a model apiserver (optimistic concurrency on `resourceVersion`) under
//! random partitions, delays and releases: at no instant do two candidates believe they lead,
//! and whoever believes it leads is the holder on record.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use valkey_sidecar_core::lease::{Candidate, LeaseAction, LeaseRecord, LeaseTimings};
use valkey_sidecar_core::time::Millis;

#[derive(Default)]
struct Store {
    record: Option<LeaseRecord>,
    version: u64,
}

impl Store {
    /// A write succeeds only against the version the writer read (409 otherwise).
    fn write(&mut self, mut rec: LeaseRecord) -> Option<LeaseRecord> {
        let current = self.record.as_ref().map_or("", |r| r.version.as_str());
        if rec.version != current {
            return None;
        }
        self.version += 1;
        rec.version = self.version.to_string();
        self.record = Some(rec.clone());
        Some(rec)
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// Candidate `i` acts after `dt` ms; `cut` says whether its requests fail.
    Act { i: usize, dt: u64, cut: bool },
    /// Candidate `i` shuts down gracefully and releases (if it leads).
    Release { i: usize },
    /// Candidate `i`'s watch delivers the record as it is now (a watching candidate otherwise
    /// hears nothing: a watch that lags or stalls is a run without this step).
    Notify { i: usize },
}

fn steps(n: usize) -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        20 => (0..n, 0u64..4_000, prop::bool::weighted(0.3)).prop_map(|(i, dt, cut)| Step::Act { i, dt, cut }),
        1 => (0..n).prop_map(|i| Step::Release { i }),
        8 => (0..n).prop_map(|i| Step::Notify { i }),
    ];
    prop::collection::vec(step, 1..300)
}

fn act(e: &mut Candidate, store: &mut Store, now: Millis, cut: bool) {
    match e.next(now).0 {
        LeaseAction::Read if !cut => e.observe(store.record.clone(), now),
        LeaseAction::Acquire | LeaseAction::Renew => {
            match (cut, store.write(e.record_to_write())) {
                (false, Some(rec)) => e.written(rec, now),
                _ => e.write_failed(now),
            }
        }
        _ => {}
    }
}

fn release(e: &mut Candidate, store: &mut Store, now: Millis) {
    if e.is_coordinator(now) {
        let mut rec = e.record_to_write();
        rec.holder = Some(String::new());
        if store.write(rec).is_some() {
            e.released();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000)))]

    /// Each candidate either polls or follows a watch (`watching`), as its watch is up or not.
    #[test]
    fn never_two_leaders(steps in steps(3), watching in prop::collection::vec(any::<bool>(), 3)) {
        let timings = LeaseTimings::default();
        let mut electors: Vec<Candidate> = (0..3).map(|i| Candidate::new(format!("pod-{i}"), timings)).collect();
        for (e, w) in electors.iter_mut().zip(watching) {
            e.set_watching(w);
        }
        let mut store = Store::default();
        let mut now = Millis(0);
        for step in steps {
            match step {
                Step::Act { i, dt, cut } => {
                    now = now.plus(dt);
                    act(&mut electors[i], &mut store, now, cut);
                }
                Step::Release { i } => release(&mut electors[i], &mut store, now),
                // As the adapter does: only a follower's view takes the watch's changes.
                Step::Notify { i } if electors[i].wants_changes() => {
                    electors[i].observe(store.record.clone(), now);
                }
                Step::Notify { .. } => {}
            }
            let leaders: Vec<&Candidate> = electors.iter().filter(|e| e.is_coordinator(now)).collect();
            prop_assert!(leaders.len() <= 1, "two leaders at {:?}", now);
            if let Some(l) = leaders.first() {
                let holder = store.record.as_ref().and_then(|r| r.holder.clone());
                prop_assert_eq!(holder.as_deref(), Some(l.identity.as_str()), "a coordinating that is not the holder on record");
                prop_assert!(l.acting_deadline().is_some_and(|d| d > now));
            }
        }
    }
}

#[test]
fn the_simulation_elects_someone() {
    let timings = LeaseTimings::default();
    let mut e = Candidate::new("solo", timings);
    let mut store = Store::default();
    for t in 0..10 {
        act(&mut e, &mut store, Millis(t * 1000), false);
    }
    assert!(e.is_coordinator(Millis(9_000)));
}
