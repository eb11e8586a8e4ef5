//! One tick: the node's own replies, in cluster mode the cluster map when due, all handed to
//! `core` as plain data.

use redis::Value;
use valkey_sidecar_core::cluster_map::{self, KnownMap, MapNeed, MapSchedule, Reading};
use valkey_sidecar_core::formation::QUESTIONS;
use valkey_sidecar_core::health::Outcome;
use valkey_sidecar_core::observation::{Mode, Observation, Replies, observe};
use valkey_sidecar_core::reply::Reply;
use valkey_sidecar_core::time::Millis;

use super::conn::{Session, ValkeyError};

/// Everything about a node in one round trip, the whole cluster map included (the coordinator's
/// reads of other pods). `ROLE` and `INFO` work while loading; the cluster commands then answer
/// `LOADING`, which `core` tolerates.
pub fn pipeline(mode: Mode) -> redis::Pipeline {
    let mut pipe = own_pipeline(mode);
    if mode == Mode::Cluster {
        pipe.cmd("CLUSTER").arg("SHARDS");
        pipe.cmd("CLUSTER").arg("NODES");
    }
    pipe
}

/// The observer's pipeline: [`pipeline`] without the whole cluster map, which [`MapReader`]
/// reads only when `core::cluster_map` says so.
pub fn own_pipeline(mode: Mode) -> redis::Pipeline {
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
    }
    pipe
}

/// A formation round's short questions to one pod (`core::formation::QUESTIONS`).
pub fn glance_pipeline() -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for question in QUESTIONS {
        pipe.cmd(question[0]).arg(&question[1..]);
    }
    pipe
}

/// The map's commands a tick needs: `CLUSTER SHARDS` (whole map only), then `CLUSTER NODES`.
fn map_pipeline(need: MapNeed) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    if need.whole {
        pipe.cmd("CLUSTER").arg("SHARDS");
    }
    pipe.cmd("CLUSTER").arg("NODES");
    pipe
}

/// Cluster mode's observation: the node's own replies on every tick, the cluster map when
/// `core::cluster_map` says it may have changed or is due, carried in between.
#[derive(Default)]
pub struct MapReader {
    schedule: MapSchedule,
    known: KnownMap,
}

impl MapReader {
    /// One tick: [`own_pipeline`]'s replies, then the map's if needed.
    pub async fn tick(
        &mut self,
        session: &mut Session,
        pipe: &redis::Pipeline,
        now: Millis,
        reading: Reading,
    ) -> (Outcome, Option<ValkeyError>) {
        let replies = match session.query(pipe).await {
            Ok(values) => replies(values),
            Err(e) => return self.failed(e),
        };
        let mut obs = match observe(&replies, Mode::Cluster) {
            Ok(obs) => obs,
            Err(refusal) => {
                self.schedule.forget();
                return (Outcome::Refused(refusal.0), None);
            }
        };
        let info = replies.cluster_info.as_ref().and_then(Reply::as_text);
        let key = cluster_map::key(&obs, info);
        let need = self.schedule.need(now, &key, &obs, reading);
        match self.complete(session, &mut obs, need).await {
            Ok(Some(nodes)) => self.schedule.read(now, key, nodes),
            Ok(None) if need.whole => self.schedule.forget(),
            Ok(None) => {}
            Err(e) => return self.failed(e),
        }
        (Outcome::Observed(Box::new(obs)), None)
    }

    /// A failed tick: whatever Valkey is after it (restarted, emptied, another node id), the
    /// next tick that reaches it reads the whole map.
    fn failed(&mut self, e: ValkeyError) -> (Outcome, Option<ValkeyError>) {
        self.schedule.forget();
        failed(e)
    }

    /// Reads what `need` asks for and fills the observation's map; the whole map's node count
    /// when it was read.
    async fn complete(
        &mut self,
        session: &mut Session,
        obs: &mut Observation,
        need: MapNeed,
    ) -> Result<Option<usize>, ValkeyError> {
        let mut read = Vec::new();
        if need.nodes {
            read = session.query(&map_pipeline(need)).await?;
        }
        let mut read = read.into_iter().map(reply);
        let shards = if need.whole { read.next() } else { None };
        let nodes = read.next();
        let Some(view) = obs.cluster.as_mut() else {
            return Ok(None);
        };
        Ok(self.known.fill(view, shards.as_ref(), nodes.as_ref()))
    }
}

fn failed(e: ValkeyError) -> (Outcome, Option<ValkeyError>) {
    if e.valkey_answered() {
        (Outcome::Refused(e.to_string()), Some(e))
    } else if e.refused() {
        (Outcome::Down(e.to_string()), Some(e))
    } else {
        (Outcome::Unreachable(e.to_string()), Some(e))
    }
}

/// Observes Valkey once and classifies the result for the health state.
pub async fn tick(
    session: &mut Session,
    pipe: &redis::Pipeline,
    mode: Mode,
) -> (Outcome, Option<ValkeyError>) {
    match session.query(pipe).await {
        Ok(values) => (outcome(values, mode), None),
        Err(e) => failed(e),
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
