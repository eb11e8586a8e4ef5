//! One tick: the same pipeline every time, its replies handed to `core` as plain data.

use redis::Value;
use valkey_sidecar_core::health::Outcome;
use valkey_sidecar_core::observation::{Mode, Replies, observe};
use valkey_sidecar_core::reply::Reply;

use super::conn::{Session, ValkeyError};

/// The commands of one tick, in one round trip. `ROLE` and `INFO` work while loading; the
/// cluster commands then answer `LOADING`, which `core` tolerates.
pub fn pipeline(mode: Mode) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("ROLE");
    pipe.cmd("INFO")
        .arg("replication")
        .arg("persistence")
        .arg("server")
        .arg("cluster")
        .arg("keyspace");
    if mode == Mode::Cluster {
        pipe.cmd("CLUSTER").arg("INFO");
        pipe.cmd("CLUSTER").arg("MYID");
        pipe.cmd("CLUSTER").arg("MYSHARDID");
        pipe.cmd("CLUSTER").arg("SHARDS");
        pipe.cmd("CLUSTER").arg("NODES");
    }
    pipe
}

/// Observes Valkey once and classifies the result for the health state.
pub async fn tick(
    session: &mut Session,
    pipe: &redis::Pipeline,
    mode: Mode,
) -> (Outcome, Option<ValkeyError>) {
    match session.query(pipe).await {
        Ok(values) => (outcome(values, mode), None),
        Err(e) if e.valkey_answered() => (Outcome::Refused(e.to_string()), Some(e)),
        Err(e) if e.refused() => (Outcome::Down(e.to_string()), Some(e)),
        Err(e) => (Outcome::Unreachable(e.to_string()), Some(e)),
    }
}

/// The pipeline's values, in [`pipeline`]'s order, as `core`'s replies (the cluster commands are
/// absent in replication mode).
pub fn replies(values: Vec<Value>) -> Replies {
    let mut replies = values.into_iter().map(|v| Some(reply(v)));
    let mut next = || replies.next().flatten();
    Replies {
        role: next(),
        info: next(),
        cluster_info: next(),
        my_id: next(),
        shard_id: next(),
        shards: next(),
        nodes: next(),
    }
}

fn outcome(values: Vec<Value>, mode: Mode) -> Outcome {
    match observe(&replies(values), mode) {
        Ok(obs) => Outcome::Observed(Box::new(obs)),
        Err(refusal) => Outcome::Refused(refusal.0),
    }
}

/// The client library's value into `core`'s reply tree.
pub fn reply(value: Value) -> Reply {
    match value {
        Value::Nil => Reply::Nil,
        Value::Int(n) => Reply::Int(n),
        Value::BulkString(b) => Reply::Text(String::from_utf8_lossy(&b).into_owned()),
        Value::SimpleString(s) => Reply::Text(s),
        Value::Okay => Reply::Text("OK".into()),
        Value::VerbatimString { text, .. } => Reply::Text(text),
        Value::Array(items) | Value::Set(items) => {
            Reply::Array(items.into_iter().map(reply).collect())
        }
        Value::Map(pairs) => Reply::Map(
            pairs
                .into_iter()
                .map(|(k, v)| (reply(k), reply(v)))
                .collect(),
        ),
        Value::Attribute { data, .. } => reply(*data),
        Value::Double(d) => Reply::Text(d.to_string()),
        Value::Boolean(b) => Reply::Int(i64::from(b)),
        Value::ServerError(e) => {
            Reply::Error(format!("{} {}", e.code(), e.details().unwrap_or_default()))
        }
        _ => Reply::Nil,
    }
}
