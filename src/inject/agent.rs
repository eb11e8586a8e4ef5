//! The agent's container and the hooks and probes that point at it, plus what inject reads from the
//! Valkey container (mode, port) to configure it.

use super::yaml::Node;
use super::{Mode, Options};
use crate::cli::config::DEFAULT_PROBE_PORT;

/// Name of the injected container; also how a second run recognises it.
pub const AGENT_NAME: &str = "valkey-sidecar";

/// The agent's own API token volume: what `automountServiceAccountToken` would mount into every
/// container, mounted into the agent alone (as the chart does).
pub const TOKEN_VOLUME: &str = "valkey-sidecar-api-access";

/// Where client libraries, the agent's among them, look for the pod's token.
const TOKEN_PATH: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// What the agent container is built from.
pub struct Agent<'a> {
    pub image: &'a str,
    pub mode: Mode,
    pub cluster: &'a str,
    pub valkey_port: u16,
    pub env: &'a [(String, String)],
    /// The preStop timeout in seconds, for the classic form (the agent must outlive the hand-over).
    pub prestop: Option<u64>,
    /// Native sidecar: an init container that keeps running (`restartPolicy: Always`).
    pub native: bool,
    /// Mounts its own API token ([`token_volume`], which the pod must carry); without it the
    /// agent uses the pod's automounted one.
    pub own_token: bool,
    /// Environment entries after the generated ones (any form, e.g. `valueFrom`); `--env` still
    /// wins over them.
    pub extra_env: Vec<Node>,
    /// Volume mounts besides the token's.
    pub mounts: Vec<Node>,
}

impl<'a> Agent<'a> {
    /// The agent in the form `opts` asks for; `timeout` is the preStop wait (classic form).
    pub fn new(
        opts: &'a Options,
        mode: Mode,
        cluster: &'a str,
        valkey_port: u16,
        timeout: u64,
    ) -> Self {
        Self {
            image: &opts.image,
            mode,
            cluster,
            valkey_port,
            env: &opts.env,
            prestop: opts.classic.then_some(timeout),
            native: !opts.classic,
            own_token: true,
            extra_env: Vec::new(),
            mounts: Vec::new(),
        }
    }

    pub fn container(&self) -> Node {
        let mut fields = vec![
            ("name", Node::str(AGENT_NAME)),
            ("image", Node::str(self.image)),
        ];
        if self.native {
            fields.push(("restartPolicy", Node::str("Always")));
        }
        let port = Node::map(vec![
            ("name", Node::str("probe")),
            ("containerPort", Node::plain(DEFAULT_PROBE_PORT)),
        ]);
        // The peer heartbeats (`crate::peers::heartbeat`) share the port number over UDP.
        let heartbeat = Node::map(vec![
            ("name", Node::str("heartbeat")),
            ("containerPort", Node::plain(DEFAULT_PROBE_PORT)),
            ("protocol", Node::str("UDP")),
        ]);
        fields.push(("ports", Node::seq(vec![port, heartbeat])));
        fields.push(("env", self.env()));
        let mut mounts = Vec::new();
        if self.own_token {
            mounts.push(volume_mount(TOKEN_VOLUME, TOKEN_PATH));
        }
        mounts.extend(self.mounts.iter().cloned());
        if !mounts.is_empty() {
            fields.push(("volumeMounts", Node::seq(mounts)));
        }
        fields.push(("resources", resources()));
        fields.push(("securityContext", security_context()));
        if let Some(timeout) = self.prestop {
            fields.push(("lifecycle", lifecycle(timeout)));
        }
        Node::map(fields)
    }

    fn env(&self) -> Node {
        let field = |name: &str, path: &str| {
            let from = Node::map(vec![("fieldPath", Node::str(path))]);
            env_var(name, ("valueFrom", Node::map(vec![("fieldRef", from)])))
        };
        let value = |name: &str, v: &str| env_var(name, ("value", Node::str(v)));
        let mut vars = vec![
            field("POD_NAME", "metadata.name"),
            field("POD_UID", "metadata.uid"),
            field("POD_NAMESPACE", "metadata.namespace"),
            field("NODE_NAME", "spec.nodeName"),
            field("POD_IP", "status.podIP"),
            value("VALKEY_ADDR", &format!("127.0.0.1:{}", self.valkey_port)),
            value("SIDECAR_MODE", self.mode.as_str()),
            value("SIDECAR_CLUSTER_NAME", self.cluster),
        ];
        vars.extend(self.extra_env.iter().cloned());
        for (name, v) in self.env {
            // `--env` wins over a generated variable of the same name rather than duplicating it.
            vars.retain(|var| var.get("name").and_then(Node::as_str) != Some(name));
            vars.push(value(name, v));
        }
        Node::seq(vars)
    }
}

/// The projected volume of [`TOKEN_VOLUME`]: a bound token (an hour, 3600 s: 3607 s is the one
/// value the apiserver extends to a year), the cluster's CA and the namespace.
pub fn token_volume() -> Node {
    let items = |item: Node| Node::seq(vec![item]);
    let token = Node::map(vec![
        ("path", Node::str("token")),
        ("expirationSeconds", Node::plain(3600)),
    ]);
    let ca = Node::map(vec![
        ("name", Node::str("kube-root-ca.crt")),
        (
            "items",
            items(Node::map(vec![
                ("key", Node::str("ca.crt")),
                ("path", Node::str("ca.crt")),
            ])),
        ),
    ]);
    let field = Node::map(vec![("fieldPath", Node::str("metadata.namespace"))]);
    let namespace = items(Node::map(vec![
        ("path", Node::str("namespace")),
        ("fieldRef", field),
    ]));
    let sources = Node::seq(vec![
        Node::map(vec![("serviceAccountToken", token)]),
        Node::map(vec![("configMap", ca)]),
        Node::map(vec![("downwardAPI", Node::map(vec![("items", namespace)]))]),
    ]);
    Node::map(vec![
        ("name", Node::str(TOKEN_VOLUME)),
        ("projected", Node::map(vec![("sources", sources)])),
    ])
}

/// A read-only mount of the pod's volume `name` at `path`.
pub fn volume_mount(name: &str, path: &str) -> Node {
    Node::map(vec![
        ("name", Node::str(name)),
        ("mountPath", Node::str(path)),
        ("readOnly", Node::plain(true)),
    ])
}

/// `name: value`.
pub fn env_value(name: &str, value: &str) -> Node {
    env_var(name, ("value", Node::str(value)))
}

/// `name` from `key` of the Secret `secret`.
pub fn env_from_secret(name: &str, secret: &str, key: &str) -> Node {
    let selector = Node::map(vec![("name", Node::str(secret)), ("key", Node::str(key))]);
    let from = Node::map(vec![("secretKeyRef", selector)]);
    env_var(name, ("valueFrom", from))
}

fn env_var(name: &str, source: (&str, Node)) -> Node {
    Node::map(vec![("name", Node::str(name)), source])
}

/// Enough for a 250 ms poll loop and a few connections (the chart's defaults): a memory limit
/// keeps a leak from starving Valkey; no CPU limit, so a burst is never throttled into a missed
/// probe.
fn resources() -> Node {
    let requests = Node::map(vec![
        ("cpu", Node::str("10m")),
        ("memory", Node::str("32Mi")),
    ]);
    let limits = Node::map(vec![("memory", Node::str("128Mi"))]);
    Node::map(vec![("requests", requests), ("limits", limits)])
}

/// The image runs as 65532 from scratch and writes nothing: everything can be locked down. No
/// fixed user id (the chart sets 65532 outside its `restricted` profile): a platform that assigns
/// ids (OpenShift's restricted-v2) refuses a fixed one, and `inject` cannot tell which it is.
fn security_context() -> Node {
    let drop = Node::map(vec![("drop", Node::seq(vec![Node::str("ALL")]))]);
    let seccomp = Node::map(vec![("type", Node::str("RuntimeDefault"))]);
    Node::map(vec![
        ("runAsNonRoot", Node::plain(true)),
        ("readOnlyRootFilesystem", Node::plain(true)),
        ("allowPrivilegeEscalation", Node::plain(false)),
        ("capabilities", drop),
        ("seccompProfile", seccomp),
    ])
}

/// `lifecycle` with the hand-over wait.
pub fn lifecycle(timeout: u64) -> Node {
    Node::map(vec![("preStop", prestop(timeout))])
}

/// `httpGet /prestop?timeout=<T>s` on the agent's port. A number, not the port's name: the
/// kubelet resolves a name against the ports of the container the hook is on.
pub fn prestop(timeout: u64) -> Node {
    Node::map(vec![("httpGet", http_get(&prestop_path(timeout)))])
}

pub fn prestop_path(timeout: u64) -> String {
    format!("/prestop?timeout={timeout}s")
}

/// Whether a preStop handler is the agent's wait (from an earlier run or written by hand).
pub fn is_agent_prestop(hook: &Node) -> bool {
    hook.at(&["httpGet", "path"])
        .and_then(Node::as_str)
        .is_some_and(|p| p.starts_with("/prestop"))
}

fn http_get(path: &str) -> Node {
    Node::map(vec![
        ("path", Node::str(path)),
        ("port", Node::plain(DEFAULT_PROBE_PORT)),
    ])
}

/// The Valkey container's probes, all answered by the agent from its cached state.
pub fn probes() -> [(&'static str, Node); 3] {
    let probe = |path: &str, period: u32, failures: u32| {
        Node::map(vec![
            ("httpGet", http_get(path)),
            ("periodSeconds", Node::plain(period)),
            ("failureThreshold", Node::plain(failures)),
        ])
    };
    // The chart's: a slow answer from the cache means a starved node, not a dead Valkey.
    let liveness = Node::map(vec![
        ("httpGet", http_get("/livez")),
        ("periodSeconds", Node::plain(5)),
        ("timeoutSeconds", Node::plain(5)),
        ("failureThreshold", Node::plain(3)),
    ]);
    [
        // Two minutes for Valkey to give its first answer (loading counts as one).
        ("startupProbe", probe("/startupz", 2, 60)),
        // `/livez` itself waits out SIDECAR_LIVENESS_WINDOW (30 s) of silence: restarts stay rare.
        ("livenessProbe", liveness),
        // Cheap (cached), so frequent: readiness, and so PodDisruptionBudgets, follow sync closely.
        ("readinessProbe", probe("/readyz", 2, 2)),
    ]
}

/// Whether `container` is the agent: by name, or by image repository (ours or `--image`'s).
pub fn is_agent(container: &Node, image: &str) -> bool {
    let name = container.get("name").and_then(Node::as_str);
    let repo = container
        .get("image")
        .and_then(Node::as_str)
        .map(repository);
    name == Some(AGENT_NAME)
        || repo.is_some_and(|r| r == repository(image) || r.rsplit('/').next() == Some(AGENT_NAME))
}

/// An image reference without tag or digest.
fn repository(image: &str) -> &str {
    let image = image.split('@').next().unwrap_or(image);
    match image.rsplit_once(':') {
        Some((repo, tag)) if !tag.contains('/') => repo,
        _ => image,
    }
}

/// `command` and `args` as words, quotes dropped (a shell `-c` line counts too).
fn words(container: &Node) -> Vec<String> {
    let parts = ["command", "args"]
        .into_iter()
        .filter_map(|k| container.get(k));
    parts
        .filter_map(Node::as_seq)
        .flatten()
        .filter_map(Node::as_str)
        .flat_map(str::split_whitespace)
        .map(|w| w.trim_matches(['"', '\'']).to_owned())
        .collect()
}

/// Cluster when Valkey is started with `cluster-enabled yes`.
pub fn detect_mode(container: &Node) -> Mode {
    let words = words(container);
    let cluster = words
        .windows(2)
        .any(|w| w[0].trim_start_matches('-') == "cluster-enabled" && w[1] == "yes");
    if cluster {
        Mode::Cluster
    } else {
        Mode::Replication
    }
}

/// Valkey's port: `--port N` in the arguments, else a port named like Valkey's, else the first
/// port that is not the cluster bus, else 6379.
pub fn detect_port(container: &Node) -> u16 {
    let words = words(container);
    let from_args = words
        .windows(2)
        .filter(|w| w[0] == "--port")
        .find_map(|w| w[1].parse::<u16>().ok().filter(|p| *p != 0));
    from_args
        .or_else(|| {
            port_by(container, |n| {
                matches!(
                    n,
                    "valkey" | "redis" | "client" | "tcp-valkey" | "tcp-redis"
                )
            })
        })
        .or_else(|| port_by(container, |n| !n.contains("bus")))
        .unwrap_or(6379)
}

fn port_by(container: &Node, name_ok: impl Fn(&str) -> bool) -> Option<u16> {
    let ports = container.get("ports").and_then(Node::as_seq)?;
    ports.iter().find_map(|p| {
        let name = p.get("name").and_then(Node::as_str).unwrap_or("");
        let port = p
            .get("containerPort")
            .and_then(Node::as_str)?
            .parse()
            .ok()?;
        name_ok(name).then_some(port)
    })
}

#[cfg(test)]
mod tests {
    use super::super::yaml::parse;
    use super::*;

    fn container(text: &str) -> Node {
        parse(text, 1)
            .ok()
            .and_then(|d| d.into_iter().next())
            .unwrap_or_else(|| Node::map(vec![]))
    }

    #[test]
    fn mode_and_port_come_from_the_valkey_container() {
        let c = container("args: [--port, '7000', --cluster-enabled, \"yes\"]\n");
        assert_eq!((detect_mode(&c), detect_port(&c)), (Mode::Cluster, 7000));
        let c = container("command: [sh, -c, 'exec valkey-server --cluster-enabled yes']\n");
        assert_eq!(detect_mode(&c), Mode::Cluster);
        let c = container(
            "ports: [{name: bus, containerPort: 16379}, {name: db, containerPort: 6380}]\n",
        );
        assert_eq!(
            (detect_mode(&c), detect_port(&c)),
            (Mode::Replication, 6380)
        );
        assert_eq!(detect_port(&container("name: x\n")), 6379);
    }

    #[test]
    fn the_agent_is_recognised_by_name_or_image() {
        let own = "registry.local/agent:1";
        assert!(is_agent(&container("name: valkey-sidecar\n"), own));
        assert!(is_agent(
            &container("image: ghcr.io/valkey-sidecar/valkey-sidecar:dev\n"),
            own
        ));
        assert!(is_agent(
            &container("image: registry.local/agent@sha256:00\n"),
            own
        ));
        assert!(!is_agent(
            &container("name: valkey\nimage: valkey/valkey:9.1.2\n"),
            own
        ));
        assert_eq!(repository("localhost:5000/a/b"), "localhost:5000/a/b");
    }
}
