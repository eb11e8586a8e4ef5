//! Workloads that run Valkey (or Redis) Sentinel: Sentinel promotes replicas by itself, so the
//! agent's coordinator would be a second failover authority, and two would fight (each undoing
//! or racing the other's promotion). inject refuses them unless `--force`.
//!
//! What counts, on any container or init container: an image or a command word that mentions
//! sentinel (`valkey-sentinel`, `redis-server … --sentinel`, `sentinel.conf`), Bitnami's
//! `REDIS_SENTINEL_*` / `VALKEY_SENTINEL_*` environment; on the pod: a label or annotation that
//! enables one (`sentinel.enabled: "true"`, `app.kubernetes.io/component: sentinel`).

use super::yaml::Node;

/// Why `pod` (`metadata` + `spec`) looks Sentinel-managed, in a few words; `None` when it does not.
pub fn detect(pod: &Node) -> Option<String> {
    let spec = pod.get("spec")?;
    let containers = ["initContainers", "containers"]
        .iter()
        .filter_map(|k| spec.get(k).and_then(Node::as_seq))
        .flatten();
    containers.filter_map(container).chain(metadata(pod)).next()
}

fn mentions(text: &str) -> bool {
    text.to_ascii_lowercase().contains("sentinel")
}

/// The first sign in one container.
fn container(c: &Node) -> Option<String> {
    let name = c.get("name").and_then(Node::as_str).unwrap_or("?");
    let image = c.get("image").and_then(Node::as_str).unwrap_or("");
    if mentions(image) {
        return Some(format!("container {name}: image {image}"));
    }
    let words = ["command", "args"]
        .iter()
        .filter_map(|k| c.get(k).and_then(Node::as_seq))
        .flatten()
        .filter_map(Node::as_str)
        .flat_map(str::split_whitespace);
    if let Some(word) = words.into_iter().find(|w| mentions(w)) {
        return Some(format!("container {name} runs {word}"));
    }
    let env = c.get("env").and_then(Node::as_seq).unwrap_or_default();
    let names = env
        .iter()
        .filter_map(|e| e.get("name").and_then(Node::as_str));
    names
        .into_iter()
        .find(|n| n.starts_with("REDIS_SENTINEL_") || n.starts_with("VALKEY_SENTINEL_"))
        .map(|n| format!("container {name} sets {n}"))
}

/// A label or annotation of the pod that enables or names a Sentinel.
fn metadata(pod: &Node) -> Option<String> {
    let maps = ["labels", "annotations"]
        .iter()
        .filter_map(|k| pod.at(&["metadata", k]));
    let entries = maps.filter_map(Node::as_map).flatten();
    entries.into_iter().find_map(|(k, v)| {
        let (key, value) = (k.as_str()?, v.as_str().unwrap_or(""));
        let enables = mentions(key) && matches!(value, "true" | "enabled" | "yes");
        (enables || value.eq_ignore_ascii_case("sentinel")).then(|| format!("{key}: {value}"))
    })
}

#[cfg(test)]
mod tests {
    use super::super::yaml::parse;
    use super::*;

    fn pod(text: &str) -> Node {
        parse(text, 1)
            .ok()
            .and_then(|d| d.into_iter().next())
            .unwrap_or_else(|| Node::map(vec![]))
    }

    #[test]
    fn each_sign_of_sentinel_is_named() {
        let cases = [
            (
                "spec: {containers: [{name: s, image: bitnami/valkey-sentinel:8}]}",
                "container s: image bitnami/valkey-sentinel:8",
            ),
            (
                "spec: {containers: [{name: v, image: valkey/valkey, args: [/etc/sentinel.conf, --sentinel]}]}",
                "container v runs /etc/sentinel.conf",
            ),
            (
                "spec: {initContainers: [{name: i, command: [sh, -c, 'exec valkey-sentinel /c']}]}",
                "container i runs valkey-sentinel",
            ),
            (
                "spec: {containers: [{name: v, env: [{name: REDIS_SENTINEL_MASTER_NAME}]}]}",
                "container v sets REDIS_SENTINEL_MASTER_NAME",
            ),
            (
                "metadata: {labels: {sentinel.enabled: 'true'}}\nspec: {containers: []}",
                "sentinel.enabled: true",
            ),
            (
                "metadata: {labels: {app.kubernetes.io/component: sentinel}}\nspec: {}",
                "app.kubernetes.io/component: sentinel",
            ),
        ];
        for (text, why) in cases {
            assert_eq!(detect(&pod(text)).as_deref(), Some(why), "{text}");
        }
    }

    #[test]
    fn a_plain_valkey_pod_is_not_sentinel() {
        let text = "metadata: {labels: {sentinel.enabled: 'false', app: valkey}}\nspec: {containers: [{name: valkey, image: valkey/valkey:9, args: [--port, '6379'], env: [{name: VALKEY_PORT}]}]}";
        assert_eq!(detect(&pod(text)), None);
    }
}
