//! Valkey on the harness's Kubernetes: the chart's label keys and ports, one-off commands to a pod's
//! Valkey, and server-side apply of plain objects. The pods themselves are the chart's (see
//! [`super::Stage`]).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::Value;

use crate::Result;
use crate::resp::{ClientOptions, Conn, Reply};

/// The agent's container port (probes, status, metrics).
pub const SIDECAR_PORT: u16 = 9736;

/// Valkey's port in the pods.
pub const VALKEY_PORT: u16 = 6379;

/// Labels valkey-operator sets (the harness sets them the same way; the agent reads them).
pub const CLUSTER_LABEL: &str = "valkey.io/cluster";
pub const SHARD_INDEX_LABEL: &str = "valkey.io/shard-index";
pub const NODE_INDEX_LABEL: &str = "valkey.io/node-index";

/// Server-side apply of one object given as JSON (`apiVersion`, `kind`, `metadata.name`).
pub async fn apply(client: &Client, object: Value) -> Result<()> {
    let (group, version) = match object["apiVersion"]
        .as_str()
        .unwrap_or("v1")
        .split_once('/')
    {
        Some((g, v)) => (g.to_owned(), v.to_owned()),
        None => (String::new(), "v1".to_owned()),
    };
    let kind = object["kind"].as_str().context("object without kind")?;
    let name = object["metadata"]["name"]
        .as_str()
        .context("object without name")?;
    let gvk = kube::api::GroupVersionKind::gvk(&group, &version, kind);
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("discovering {kind}"))?;
    let api: Api<kube::api::DynamicObject> =
        match (caps.scope, object["metadata"]["namespace"].as_str()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(client.clone(), ns, &resource)
            }
            _ => Api::all_with(client.clone(), &resource),
        };
    let params = PatchParams::apply("valkey-testkit").force();
    api.patch(name, &params, &Patch::Apply(&object))
        .await
        .with_context(|| format!("applying {kind} {name}"))?;
    Ok(())
}

/// One command on a fresh connection (the pods are few and the formation short).
pub fn cmd(addr: SocketAddr, args: &[&str]) -> Result<redis::Value> {
    cmd_as(addr, None, args)
}

/// [`cmd`] as the default user with `password` (if any).
pub fn cmd_as(addr: SocketAddr, password: Option<&str>, args: &[&str]) -> Result<redis::Value> {
    let (name, rest) = args.split_first().context("empty command")?;
    let url = match password {
        Some(p) => format!("redis://:{}@{addr}", percent_encode(p)),
        None => format!("redis://{addr}"),
    };
    let client = redis::Client::open(url)?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .with_context(|| format!("connecting to {addr}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut c = redis::cmd(name);
    for a in rest {
        c.arg(*a);
    }
    c.query(&mut conn)
        .with_context(|| format!("{name} on {addr}"))
}

/// [`cmd_as`] with `client`'s password, and over TLS when `client` has it (a TLS-only Valkey:
/// the name `client` verifies must be in the server's certificate).
pub fn cmd_with(addr: SocketAddr, client: &ClientOptions, args: &[&str]) -> Result<redis::Value> {
    if client.tls.is_none() {
        return cmd_as(addr, client.password.as_deref(), args);
    }
    let opts = ClientOptions {
        timeout: Duration::from_secs(5),
        ..client.clone()
    };
    let mut conn = Conn::connect(addr, &opts).with_context(|| format!("connecting to {addr}"))?;
    conn.call(args).map(value)
}

/// A reply as the `redis` crate's value, which the harness's queries parse.
fn value(reply: Reply) -> redis::Value {
    match reply {
        Reply::Simple(s) => redis::Value::SimpleString(s),
        Reply::Error(e) => redis::Value::SimpleString(e),
        Reply::Int(i) => redis::Value::Int(i),
        Reply::Bulk(Some(b)) => redis::Value::BulkString(b),
        Reply::Array(Some(items)) => redis::Value::Array(items.into_iter().map(value).collect()),
        Reply::Bulk(None) | Reply::Array(None) => redis::Value::Nil,
    }
}

/// `podIP:6379`, once the pod has an IP.
pub fn valkey_addr(pod: &Pod) -> Option<SocketAddr> {
    let ip = pod.status.as_ref()?.pod_ip.as_ref()?.parse().ok()?;
    Some(SocketAddr::new(ip, VALKEY_PORT))
}

pub(crate) fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
