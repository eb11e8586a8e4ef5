//! valkey-operator's `ValkeyCluster` (`valkey.io/v1alpha1`): its pods are the operator's, and
//! `spec.containers` is a strategic merge patch onto them — an entry named `server` merges into
//! the Valkey container, any other name is appended as a regular container.
//!
//! So the agent goes in as a classic sidecar (with its own preStop), the hand-over wait goes on
//! `server`, and the operator's exec probes stay: a merge would add our `httpGet` next to their
//! `exec`, which the apiserver rejects (one handler per probe).
//!
//! What the agent is given, from the operator's source (github.com/valkey-io/valkey-operator):
//! - TLS: `spec.networking.tls.certificates.server.secretName` (api/v1alpha1/valkeycluster_types.go
//!   `NetworkingSpec`, `TLSSpec`). With it the operator mounts that Secret as the volume `tls-certs`
//!   at `/tls` (`ca.crt`, `tls.crt`, `tls.key`; internal/controller/utils.go,
//!   valkeynode_resources.go) and serves TLS on 6379 with the plain port closed (`tls-port 6379`,
//!   `port 0`, `tls-auth-clients optional`: internal/controller/config.go). The agent mounts the
//!   same volume and verifies the name the operator verifies, `valkey-<cluster>.<ns>.svc.cluster.local`
//!   (internal/controller/valkeycluster_controller.go `getValkeyClusterState`).
//! - Password: the operator passes Secrets as env (`valueFrom.secretKeyRef`), and a `spec.users`
//!   entry takes its password from `passwordSecret` — Secret `<cluster>-users` and key = the user
//!   name by default (api/v1alpha1/valkeyacls_types.go, internal/controller/users.go
//!   `fetchUserPasswords`). The agent gets an ACL user of its own there and `VALKEY_PASSWORD` from
//!   the same Secret and key; the operator's `_operator` user lacks commands the agent sends.
//! - ServiceAccount: a ValkeyCluster has no field for one (nor do the ValkeyNodes it makes), so the
//!   pods run as the namespace's `default`; inject prints the RBAC to bind to it.

use super::agent::{self, Agent};
use super::pod;
use super::yaml::Node;
use super::{Injection, Mode, Notes, Options, Problem};

/// The API group whose `ValkeyCluster` this is (others, e.g. other operators', are left alone).
pub const GROUP: &str = "valkey.io/";

/// valkey-operator's port for Valkey, plain or TLS (`DefaultPort`).
const OPERATOR_PORT: u16 = 6379;

/// The operator's certificate volume and where it mounts it (`tlsVolumeName`, `tlsCertMountPath`).
const TLS_VOLUME: &str = "tls-certs";
const TLS_PATH: &str = "/tls";

/// The agent's ACL user in `spec.users` (and its default password key).
const AGENT_USER: &str = agent::AGENT_NAME;

/// The chart's ACL rules for the agent in cluster mode (charts/valkey-sidecar/templates/
/// _helpers.tpl), without the formation commands: the operator forms the cluster.
pub const AGENT_RULES: &str = "resetkeys resetchannels -@all +ping +role +info +wait +replicaof \
    +multi +exec +discard +client|pause +client|unpause +client|setinfo +config|set \
    +cluster|info +cluster|myid +cluster|myshardid +cluster|shards +cluster|nodes \
    +cluster|failover";

pub fn inject(
    doc: &mut Node,
    name: &str,
    opts: &Options,
    notes: &mut Notes,
) -> Result<Injection, Problem> {
    let namespace = doc
        .at(&["metadata", "namespace"])
        .and_then(Node::as_str)
        .map(str::to_owned);
    let spec = doc
        .entry("spec", || Node::map(vec![]))
        .ok_or(Problem::NoPodSpec)?;
    let containers = spec
        .get("containers")
        .and_then(Node::as_seq)
        .unwrap_or_default();
    if containers.iter().any(|c| agent::is_agent(c, &opts.image)) {
        return Ok(Injection::AlreadyInjected);
    }
    // Unset, the operator derives at least 30 s: the default wait fits.
    let timeout = pod::prestop_timeout(spec, pod::DEFAULT_GRACE, notes);
    let tls = has_tls(spec);
    let login = agent_login(spec, name, notes);
    let containers = spec
        .entry("containers", || Node::seq(vec![]))
        .and_then(Node::seq_mut)
        .ok_or(Problem::NoPodSpec)?;
    pod::add_prestop(server(containers, opts), timeout, notes);
    let mode = opts.mode.unwrap_or(Mode::Cluster);
    let cluster = opts.cluster_name.as_deref().unwrap_or(name);
    // Whatever `--classic` says: an appended entry is a regular container.
    // The operator makes the pods and their volumes: the agent uses the automounted token, which
    // every container of those pods holds (said below).
    let mut agent = Agent {
        native: false,
        prestop: Some(timeout),
        own_token: false,
        ..Agent::new(opts, mode, cluster, OPERATOR_PORT, timeout)
    };
    agent.extra_env = operator_env(name, login.as_ref(), tls);
    if tls {
        // A volume of the operator's pods: a patch entry may mount it.
        agent.mounts.push(agent::volume_mount(TLS_VOLUME, TLS_PATH));
    }
    containers.push(agent.container());
    notes.warn(format!(
        "ValkeyCluster {name}: the agent is a classic sidecar and the operator's own probes stay on \
         `server`"
    ));
    service_account(name, namespace.as_deref(), opts, notes);
    Ok(Injection::Injected)
}

/// Whether the cluster serves TLS (and only TLS): `spec.networking.tls`.
fn has_tls(spec: &Node) -> bool {
    spec.at(&["networking", "tls"])
        .is_some_and(|tls| tls.as_map().is_some())
}

/// Where the agent's password is: a Secret and its key.
struct Login {
    secret: String,
    key: String,
}

/// The agent's ACL user in `spec.users`: one already there (its own rules and password source
/// kept), else added with the chart's rules and the operator's default password source.
/// `None`: the user has no password (`nopass`).
fn agent_login(spec: &mut Node, cluster: &str, notes: &mut Notes) -> Option<Login> {
    let users = spec
        .entry("users", || Node::seq(vec![]))
        .and_then(Node::seq_mut)?;
    let named = |u: &Node| u.get("name").and_then(Node::as_str) == Some(AGENT_USER);
    match users.iter().find(|u| named(u)) {
        Some(user) if user.get("nopass").and_then(Node::as_str) == Some("true") => None,
        Some(user) => Some(login_of(user, cluster)),
        None => {
            let login = Login {
                secret: format!("{cluster}-users"),
                key: AGENT_USER.to_owned(),
            };
            users.push(agent_user(&login));
            new_secret_key(cluster, &login, notes);
            Some(login)
        }
    }
}

/// The Secret key of a user inject added must exist before the operator sees the user.
fn new_secret_key(cluster: &str, login: &Login, notes: &mut Notes) {
    notes.warn(format!(
        "ValkeyCluster {cluster}: the agent logs in as ACL user {AGENT_USER} (added to spec.users) \
         with the password under key {key} of Secret {secret}; create it before applying, or the operator \
         cannot write the cluster's ACLs: kubectl create secret generic {secret} \
         --from-literal={key}=\"$(openssl rand -hex 24)\" (or add the key to the Secret)",
        key = login.key,
        secret = login.secret,
    ));
}

/// The password source of a `spec.users` entry, with the operator's defaults.
fn login_of(user: &Node, cluster: &str) -> Login {
    let source = user.get("passwordSecret");
    let secret = source
        .and_then(|s| s.get("name"))
        .and_then(Node::as_str)
        .map_or_else(|| format!("{cluster}-users"), str::to_owned);
    // Any of several keys (a rotation) logs in; the first will do.
    let key = source
        .and_then(|s| s.get("keys"))
        .and_then(Node::as_seq)
        .and_then(|keys| keys.first())
        .and_then(Node::as_str)
        .unwrap_or(AGENT_USER)
        .to_owned();
    Login { secret, key }
}

fn agent_user(login: &Login) -> Node {
    let keys = Node::seq(vec![Node::str(&login.key)]);
    let source = Node::map(vec![("name", Node::str(&login.secret)), ("keys", keys)]);
    Node::map(vec![
        ("name", Node::str(AGENT_USER)),
        ("passwordSecret", source),
        ("permissions", Node::str(AGENT_RULES)),
    ])
}

/// The agent's settings for an operator's cluster: defer to the operator, its login, TLS.
fn operator_env(name: &str, login: Option<&Login>, tls: bool) -> Vec<Node> {
    let mut env = vec![
        agent::env_value("SIDECAR_COORDINATION", "operator"),
        agent::env_value("SIDECAR_OPERATOR_RESOURCE", name),
        agent::env_value("VALKEY_USERNAME", AGENT_USER),
    ];
    if let Some(login) = login {
        env.push(agent::env_from_secret(
            "VALKEY_PASSWORD",
            &login.secret,
            &login.key,
        ));
    }
    if tls {
        // No client certificate: the operator's `tls-auth-clients optional` needs none, and its
        // server certificate may not be valid for client use.
        env.extend([
            agent::env_value("VALKEY_TLS", "true"),
            agent::env_value("VALKEY_TLS_CA_FILE", &format!("{TLS_PATH}/ca.crt")),
            // `$(POD_NAMESPACE)`: expanded by the kubelet from the variable set before it.
            agent::env_value(
                "VALKEY_TLS_SERVER_NAME",
                &format!("valkey-{name}.$(POD_NAMESPACE).svc.cluster.local"),
            ),
        ]);
    }
    env
}

/// The pods run as the namespace's `default` ServiceAccount: said, with the RBAC to bind to it.
fn service_account(name: &str, namespace: Option<&str>, opts: &Options, notes: &mut Notes) {
    let ignored = if opts.service_account.is_some() {
        " (--service-account cannot change that)"
    } else {
        ""
    };
    notes.warn(format!(
        "ValkeyCluster {name}: its pods run as the namespace's `default` ServiceAccount, as a \
         ValkeyCluster has no field for another{ignored}, and the agent uses its automounted \
         token: the RBAC printed below grants what the agent needs to every pod running as \
         `default` there (give the cluster a namespace of its own), and is needed: without it \
         the agent can neither label pods nor read the ValkeyCluster"
    ));
    notes.show(rbac(namespace));
}

/// The chart's Role for pods it does not render (charts/valkey-sidecar/templates/rbac.yaml with
/// `valkey.enabled: false`, no supervised roll: the operator rolls), Leases owned by the
/// ServiceAccount, plus reading ValkeyClusters (the agent defers to their ready condition).
pub fn rbac(namespace: Option<&str>) -> String {
    let ns = namespace.map_or_else(String::new, |ns| format!("  namespace: {ns}\n"));
    let target = namespace.map_or_else(
        || "the ValkeyCluster's namespace: kubectl apply -n NAMESPACE -f -".to_owned(),
        |ns| format!("namespace {ns}: kubectl apply -f -"),
    );
    format!(
        "# The valkey-sidecar agent's RBAC in valkey-operator's pods, {target}
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: valkey-sidecar
{ns}rules:
  - apiGroups: [\"\"]
    resources: [\"pods\"]
    verbs: [\"get\", \"list\", \"watch\", \"patch\"]
  - apiGroups: [\"\"]
    resources: [\"events\"]
    verbs: [\"create\"]
  - apiGroups: [\"coordination.k8s.io\"]
    resources: [\"leases\"]
    verbs: [\"get\", \"list\", \"watch\", \"create\", \"update\"]
  # The agents own their Leases by their ServiceAccount.
  - apiGroups: [\"\"]
    resources: [\"serviceaccounts\"]
    resourceNames: [\"default\"]
    verbs: [\"get\"]
  - apiGroups: [\"valkey.io\"]
    resources: [\"valkeyclusters\"]
    verbs: [\"get\", \"list\", \"watch\"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: valkey-sidecar
{ns}roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: valkey-sidecar
subjects:
  # No namespace: the binding's own.
  - kind: ServiceAccount
    name: default
"
    )
}

/// The patch entry for the Valkey container (`server`, or `--container`), added when missing.
fn server<'a>(containers: &'a mut Vec<Node>, opts: &Options) -> &'a mut Node {
    let name = opts.container.as_deref().unwrap_or("server");
    let named = |c: &Node| c.get("name").and_then(Node::as_str) == Some(name);
    let index = match containers.iter().position(named) {
        Some(index) => index,
        None => {
            containers.push(Node::map(vec![("name", Node::str(name))]));
            containers.len() - 1
        }
    };
    &mut containers[index]
}
