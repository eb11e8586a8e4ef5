//! Property tests: parsers are total on arbitrary input, and the health rules keep their
//! promises whatever sequence of outcomes they see.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use valkey_sidecar_core::health::{Bounds, HealthState, Outcome};
use valkey_sidecar_core::info::Info;
use valkey_sidecar_core::observation::{Mode, Observation, PrimaryLink, Replies, Role, observe};
use valkey_sidecar_core::reply::Reply;
use valkey_sidecar_core::shards::parse_shards;
use valkey_sidecar_core::time::Millis;

/// Cases per property; `PROPTEST_CASES` overrides it for long runs.
fn cases() -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    ProptestConfig::with_cases(n)
}

/// Text that looks like Valkey's: INFO-ish lines, keys the parsers look for, junk.
fn texty() -> impl Strategy<Value = String> {
    let word = prop_oneof![
        Just("role:master".to_owned()),
        Just("role:slave".to_owned()),
        Just("loading:1".to_owned()),
        Just("master_link_status:up".to_owned()),
        Just("slave0:ip=1,port=x,offset=-3".to_owned()),
        Just("cluster_state:ok".to_owned()),
        Just("master_repl_offset:99999999999999999999".to_owned()),
        Just("master".to_owned()),
        Just("slave".to_owned()),
        Just("id".to_owned()),
        Just("nodes".to_owned()),
        Just("slots".to_owned()),
        Just("port".to_owned()),
        Just("health".to_owned()),
        "\\PC{0,12}",
    ];
    prop::collection::vec(word, 0..8).prop_map(|w| w.join("\r\n"))
}

fn reply() -> impl Strategy<Value = Reply> {
    let leaf = prop_oneof![
        Just(Reply::Nil),
        any::<i64>().prop_map(Reply::Int),
        texty().prop_map(Reply::Text),
        texty().prop_map(Reply::Error),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Reply::Array),
            prop::collection::vec((inner.clone(), inner), 0..4).prop_map(Reply::Map),
        ]
    })
}

fn replies() -> impl Strategy<Value = Replies> {
    let r = || prop::option::of(reply());
    (r(), r(), r(), r(), r(), r(), r()).prop_map(
        |(role, info, cluster_info, my_id, shard_id, shards, nodes)| Replies {
            role,
            info,
            cluster_info,
            my_id,
            shard_id,
            shards,
            nodes,
        },
    )
}

fn observation() -> impl Strategy<Value = Observation> {
    (
        any::<bool>(),
        prop_oneof![
            Just(Role::Primary),
            Just(Role::Replica),
            Just(Role::Unknown)
        ],
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(|(loading, role, up, sync)| Observation {
            role,
            loading,
            link: (role == Role::Replica).then(|| PrimaryLink {
                up,
                sync_in_progress: sync,
                ..PrimaryLink::default()
            }),
            ..Observation::default()
        })
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        observation().prop_map(|o| Outcome::Observed(Box::new(o))),
        "\\PC{0,8}".prop_map(Outcome::Refused),
        "\\PC{0,8}".prop_map(Outcome::Unreachable),
        "\\PC{0,8}".prop_map(Outcome::Down),
    ]
}

const BOUNDS: Bounds = Bounds {
    liveness_window_ms: 5_000,
    stale_after_ms: 1_000,
    max_lag_bytes: 100,
};

proptest! {
    #![proptest_config(cases())]

    #[test]
    fn parsers_never_panic(r in replies(), text in texty(), any_reply in reply()) {
        let _ = observe(&r, Mode::Cluster);
        let _ = observe(&r, Mode::Replication);
        let _ = Info::parse(&text);
        let _ = parse_shards(&any_reply);
    }

    /// Whatever happened before, the verdicts only vouch for what the latest fresh observation shows.
    #[test]
    fn verdicts_follow_the_latest_fresh_observation(
        steps in prop::collection::vec((0u64..3_000, outcome()), 1..20),
        mode in prop_oneof![Just(Mode::Cluster), Just(Mode::Replication)],
    ) {
        let mut h = HealthState::new(Millis(0));
        let mut now = Millis(0);
        for (dt, o) in steps {
            now = now.plus(dt);
            h.record(now, o);
            let ready = h.readiness(now, &BOUNDS, mode, None).ok;
            let fresh = h.observation.as_ref().filter(|(at, _)| now.since(*at) <= BOUNDS.stale_after_ms).map(|(_, o)| o);
            match fresh {
                None => {
                    prop_assert!(!ready);
                    prop_assert_eq!(h.role(now, &BOUNDS), Role::Unknown);
                }
                Some(o) if o.loading => {
                    prop_assert!(!ready);
                    prop_assert_eq!(h.role(now, &BOUNDS), Role::Unknown);
                }
                Some(o) => {
                    prop_assert_eq!(h.role(now, &BOUNDS), o.role);
                    if o.role == Role::Replica {
                        let link = o.link.as_ref().unwrap();
                        prop_assert_eq!(ready, link.up && !link.sync_in_progress);
                    }
                    if o.role == Role::Unknown { prop_assert!(!ready); }
                }
            }
            // The loop just ticked, so liveness is exactly "Valkey answered within the window".
            let answered = now.since(h.last_answer.unwrap_or(Millis(0))) <= BOUNDS.liveness_window_ms;
            prop_assert_eq!(h.liveness(now, &BOUNDS).ok, answered);
        }
    }
}
