//! The configurations the report prints beside each row, read from their sources at build time
//! (the chart's `values.yaml`, the agent's flag defaults), so a changed default cannot leave the
//! report describing an older one.

use valkey_sidecar_bench::sentinel::SentinelOptions;

use crate::failover::MIN_REPLICAS;

/// The chart's values, as the stage installs them (no overrides for the Valkey settings).
const VALUES: &str = include_str!("../../../../charts/valkey-sidecar/values.yaml");
/// The agent's flags and their defaults.
const AGENT_FLAGS: &str = include_str!("../../../../src/cli/config.rs");

/// A scalar of `values.yaml` by its path of keys (`["valkey", "clusterNodeTimeout"]`); only as
/// much YAML as the chart's own file needs: nested maps by indentation, comments, plain scalars.
pub fn chart_value(path: &[&str]) -> Option<String> {
    yaml_scalar(VALUES, path)
}

fn yaml_scalar(text: &str, path: &[&str]) -> Option<String> {
    let (first, rest) = path.split_first()?;
    let mut lines = text
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    let indent = |l: &str| l.len() - l.trim_start().len();
    let line = lines.find(|l| indent(l) == 0 && key_of(l) == Some(first))?;
    if rest.is_empty() {
        return value_of(line);
    }
    // The key's block: the following lines indented deeper, with that indentation removed.
    let block: Vec<&str> = lines.take_while(|l| indent(l) > 0).collect();
    let depth = block.first().map_or(0, |l| indent(l));
    let inner: Vec<&str> = block
        .iter()
        .map(|l| l.get(depth.min(indent(l))..).unwrap_or(l))
        .collect();
    yaml_scalar(&inner.join("\n"), rest)
}

fn key_of(line: &str) -> Option<&str> {
    line.trim().split_once(':').map(|(k, _)| k.trim())
}

fn value_of(line: &str) -> Option<String> {
    let (_, v) = line.split_once(':')?;
    let v = v.split(" #").next().unwrap_or(v).trim().trim_matches('"');
    (!v.is_empty()).then(|| v.to_string())
}

/// The default of the agent's flag read from `env` (`SIDECAR_LEASE_DURATION` → `15s`).
pub fn agent_default(env: &str) -> Option<String> {
    let needle = format!("env = \"{env}\"");
    let line = AGENT_FLAGS.lines().find(|l| l.contains(&needle))?;
    let (_, after) = line.split_once("default_value = \"")?;
    after.split('"').next().map(str::to_string)
}

/// A chart value for the report, `?` when the file no longer has it (the report then shows the
/// gap instead of a stale figure).
fn chart(path: &[&str]) -> String {
    chart_value(path).unwrap_or_else(|| "?".into())
}

fn agent(env: &str) -> String {
    agent_default(env).unwrap_or_else(|| "?".into())
}

/// The chart's Valkey settings that shape failovers, in replication mode.
pub fn chart_replication() -> String {
    format!(
        "the chart's defaults: `min-replicas-to-write {}`, `min-replicas-max-lag {}`, `repl-diskless-sync-delay {}`, persistence {}, auth {}",
        MIN_REPLICAS[0].1,
        chart(&["valkey", "minReplicasMaxLag"]),
        chart(&["valkey", "replDisklessSyncDelay"]),
        on_off(&chart(&["persistence", "enabled"])),
        on_off(&chart(&["auth", "enabled"])),
    )
}

/// The chart's Valkey settings that shape failovers, in cluster mode.
pub fn chart_cluster() -> String {
    format!(
        "the chart's defaults: `cluster-node-timeout {}`, `repl-diskless-sync-delay {}`, persistence {}, auth {}",
        chart(&["valkey", "clusterNodeTimeout"]),
        chart(&["valkey", "replDisklessSyncDelay"]),
        on_off(&chart(&["persistence", "enabled"])),
        on_off(&chart(&["auth", "enabled"])),
    )
}

fn on_off(v: &str) -> &'static str {
    match v {
        "true" => "on",
        "false" => "off",
        _ => "?",
    }
}

/// The agent's Lease timings: `env`'s overrides, else its defaults; and its poll period.
pub fn lease(env: &[(&str, &str)]) -> String {
    let value = |name: &str| {
        env.iter()
            .find(|(k, _)| *k == name)
            .map_or_else(|| agent(name), |(_, v)| (*v).to_string())
    };
    let overridden = env.iter().any(|(k, _)| k.starts_with("SIDECAR_LEASE_"));
    format!(
        "lease {}, renew deadline {}, retry {}{}; poll {}",
        value("SIDECAR_LEASE_DURATION"),
        value("SIDECAR_LEASE_RENEW_DEADLINE"),
        value("SIDECAR_LEASE_RETRY_PERIOD"),
        if overridden {
            ""
        } else {
            " (the agent's defaults)"
        },
        value("SIDECAR_POLL_INTERVAL"),
    )
}

/// A Sentinel deployment's configuration: the sentinels' and their Valkeys'.
pub fn sentinel(opts: &SentinelOptions, valkey: &[(&str, &str)]) -> String {
    let valkey = match valkey {
        [] => "Valkey's defaults (no `min-replicas-to-write`)".to_string(),
        args => args
            .iter()
            .map(|(k, v)| format!("`{k} {v}`"))
            .collect::<Vec<_>>()
            .join(", "),
    };
    format!(
        "{} sentinels, quorum {}, `down-after-milliseconds {}`, `failover-timeout {}`, `parallel-syncs {}`, `primary-reboot-down-after-period {}`; Valkey: {valkey}, `repl-diskless-sync-delay 0`, no persistence",
        opts.count,
        opts.quorum,
        opts.down_after.as_millis(),
        opts.failover_timeout.as_millis(),
        opts.parallel_syncs,
        opts.primary_reboot_down_after.as_millis(),
    )
}

/// Valkey Cluster on its own, as `alone` runs it (testkit's servers: no persistence, no delay
/// before a full sync).
pub fn valkey_alone(node_timeout_ms: u64, shutdown_on_sigterm: &str) -> String {
    format!(
        "`cluster-node-timeout {node_timeout_ms}`, `shutdown-on-sigterm {shutdown_on_sigterm}`, `repl-diskless-sync-delay 0`, no persistence"
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn reads_nested_scalars_and_skips_comments() {
        let yaml = "# top\nmode: cluster\nvalkey:\n  # -- a comment: with a colon\n  port: 6379\n  image:\n    tag: \"9.1.2\"\n  clusterNodeTimeout: 5000\nauth:\n  enabled: true\n";
        assert_eq!(yaml_scalar(yaml, &["mode"]).as_deref(), Some("cluster"));
        assert_eq!(
            yaml_scalar(yaml, &["valkey", "clusterNodeTimeout"]).as_deref(),
            Some("5000")
        );
        assert_eq!(
            yaml_scalar(yaml, &["valkey", "image", "tag"]).as_deref(),
            Some("9.1.2")
        );
        assert_eq!(
            yaml_scalar(yaml, &["auth", "enabled"]).as_deref(),
            Some("true")
        );
        assert_eq!(yaml_scalar(yaml, &["valkey", "missing"]), None);
    }

    /// The chart and the agent still have every setting the report names.
    #[test]
    fn the_sources_have_every_setting_printed() {
        for text in [chart_replication(), chart_cluster(), lease(&[])] {
            assert!(!text.contains('?'), "{text}");
        }
        assert_eq!(
            agent_default("SIDECAR_LEASE_DURATION").as_deref(),
            Some("15s")
        );
        let lease = lease(&[("SIDECAR_LEASE_DURATION", "4s")]);
        assert!(lease.starts_with("lease 4s, renew deadline 10s"), "{lease}");
    }

    /// What the Sentinel baseline's Valkeys run is what the chart gives ours.
    #[test]
    fn min_replicas_are_the_charts() {
        assert_eq!(
            chart_value(&["valkey", "minReplicasMaxLag"]).as_deref(),
            Some(MIN_REPLICAS[1].1)
        );
        // `null`: 1 whenever the shard has replicas, as every benchmark stage has.
        assert_eq!(
            chart_value(&["valkey", "minReplicasToWrite"]).as_deref(),
            Some("null")
        );
    }
}
