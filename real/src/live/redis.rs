// Over 600 lines: the binding of every stream command, each a branch of
// `execute`, beside the connections and names they use.
//! The stream client on Redis (redis-rs, tokio): a single server through a
//! `ConnectionManager`, or a Redis Cluster through redis-rs' cluster client,
//! which follows the slots (MOVED, ASK) and a failover on its own.
//!
//! Each [`StreamOp`] is one Redis command (or, for `Locate`, one pipeline of
//! read-only commands), the twin of the `pelican_model::Stream` method that
//! `World::execute` calls for it; the replies are parsed into the same
//! [`StreamReply`] values. Connection failures and timeouts are
//! [`Unavailable`]; Redis errors the protocol knows (`NOGROUP`) are answers.

use crate::driver::{StreamClient, StreamResult};
use pelican_model::ids::{Dispatch, EntryId, Partition, RunId};
use pelican_model::protocol::{
    DeadEntry, GroupState, JobEntry, QueueState, StreamOp, StreamReply, Unavailable,
};
use pelican_model::stream::{AutoClaim, StreamError};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, RedisFuture, Value};
use std::time::Duration;

mod decode;
mod reads;

use decode::*;
pub use decode::{decode_job, encode_job, read_entries};

/// `ForgetConsumers`' script, with the condition a consumer must meet
/// besides its idle time. KEYS[1] is the job stream, ARGV[1] the group,
/// ARGV[2] the idle time in ms. XGROUP DELCONSUMER deletes a consumer's
/// pending entries with it: the check and the delete must be one step.
/// Without the key or the group, nothing (as the model's
/// `Stream::xinfo_consumers` errs and `forget` deletes none).
macro_rules! forget_script {
    ($condition:literal) => {
        concat!(
            "if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end\n",
            "local consumers = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])\n",
            "if consumers['err'] then return 0 end\n",
            "local idle, n = tonumber(ARGV[2]), 0\n",
            "for _, c in ipairs(consumers) do\n",
            "  local f = {}\n",
            "  for i = 1, #c, 2 do f[c[i]] = c[i + 1] end\n",
            "  if ",
            $condition,
            "f['idle'] >= idle then\n",
            "    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], f['name'])\n",
            "    n = n + 1\n",
            "  end\n",
            "end\n",
            "return n\n",
        )
    };
}

/// Deletes the idle consumers that hold nothing.
const FORGET_CONSUMERS: &str = forget_script!("f['pending'] == 0 and ");

/// The mutant `ForgetHolders`: deletes idle consumers whatever they hold.
#[cfg(feature = "mutants")]
const DROP_CONSUMERS: &str = forget_script!("");

/// Where Redis is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisAddr {
    /// One server (`redis://host:port`).
    Server(String),
    /// A Redis Cluster, by the URLs of some of its nodes: the client reads
    /// the slot map from the first that answers.
    Cluster(Vec<String>),
}

impl RedisAddr {
    /// `url` as one server, or with `cluster` as a comma-separated list of
    /// seed nodes.
    #[must_use]
    pub fn new(url: &str, cluster: bool) -> RedisAddr {
        if cluster {
            RedisAddr::Cluster(
                url.split(',')
                    .map(str::trim)
                    .filter(|u| !u.is_empty())
                    .map(str::to_owned)
                    .collect(),
            )
        } else {
            RedisAddr::Server(url.to_owned())
        }
    }

    /// The address for messages.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            RedisAddr::Server(url) => url.clone(),
            RedisAddr::Cluster(seeds) => format!("the cluster at {}", seeds.join(",")),
        }
    }
}

/// A connection to a single server or to a cluster; both multiplex, both
/// reconnect on their own.
#[derive(Clone)]
pub enum RedisConn {
    /// One server.
    Server(ConnectionManager),
    /// A cluster: a connection per node, each command sent to its key's
    /// slot's master.
    Cluster(ClusterConnection),
}

impl redis::aio::ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Server(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Server(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Server(c) => c.get_db(),
            RedisConn::Cluster(c) => c.get_db(),
        }
    }
}

/// Where the streams live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamNames {
    /// The job stream (`pelican:jobs`), partition 0's.
    pub jobs: String,
    /// Every partition's job stream, partition `p` at index `p`.
    pub partitions: Vec<String>,
    /// The dead-letter stream (`pelican:jobs:dead`).
    pub dead: String,
    /// The consumer group (`pelican`).
    pub group: String,
}

/// Redis Cluster's slots.
const SLOTS: u32 = 16_384;

/// The slot of `key` on a Redis Cluster: CRC16 (XMODEM) of its hash tag,
/// or of the whole key without one.
#[must_use]
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|b| *b == b'{').and_then(|open| {
        let close = bytes[open + 1..].iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &bytes[open + 1..open + 1 + close])
    });
    let slot = crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(bytes));
    u16::try_from(u32::from(slot) % SLOTS).expect("below the slot count")
}

impl StreamNames {
    /// The names under `prefix`: `<prefix>:jobs`, `<prefix>:jobs:dead`, and
    /// the group `group`; one partition.
    #[must_use]
    pub fn new(prefix: &str, group: &str) -> StreamNames {
        let jobs = format!("{prefix}:jobs");
        StreamNames {
            partitions: vec![jobs.clone()],
            jobs,
            dead: format!("{prefix}:jobs:dead"),
            group: group.to_owned(),
        }
    }

    /// The names of `partitions` partitions. Partition 0 keeps
    /// `<prefix>:jobs`; partition `p` is `<prefix>:jobs:<p>:{<tag>}`, whose
    /// hash tag puts it `p` N-ths of the slots past partition 0's slot. On a
    /// cluster whose masters hold equal ranges of slots (as `redis-cli
    /// --cluster create` makes them), N partitions over N masters land one
    /// on each.
    ///
    /// # Errors
    /// With more than one partition, a prefix with a hash tag (`{`): it
    /// would put every partition on one slot.
    pub fn partitioned(prefix: &str, group: &str, partitions: Partition) -> Result<Self, String> {
        let mut names = StreamNames::new(prefix, group);
        if partitions <= 1 {
            return Ok(names);
        }
        if prefix.contains(['{', '}']) {
            return Err(format!(
                "the stream prefix {prefix:?} has a hash tag, which would put all {partitions} \
                 partitions on one slot: drop the braces"
            ));
        }
        let first = u32::from(key_slot(&names.jobs));
        for p in 1..u32::from(partitions) {
            let target = (first + p * SLOTS / u32::from(partitions)) % SLOTS;
            let tag = (0_u32..)
                .map(|k| format!("{k:x}"))
                .find(|tag| u32::from(key_slot(&format!("{{{tag}}}"))) == target)
                .expect("every slot has a short tag");
            names
                .partitions
                .push(format!("{prefix}:jobs:{p}:{{{tag}}}"));
        }
        Ok(names)
    }

    /// The job stream of `partition`, if there is such a partition.
    #[must_use]
    pub fn key(&self, partition: Partition) -> Option<&str> {
        self.partitions
            .get(usize::from(partition))
            .map(String::as_str)
    }
}

/// The Redis stream client.
#[derive(Clone)]
pub struct RedisStream {
    /// Every command but the blocking read.
    conn: RedisConn,
    /// XREADGROUP ... BLOCK, one connection per partition: a blocked read
    /// holds its connection, so it must never delay a heartbeat, or another
    /// partition's read, queued behind it on a multiplexed one.
    readers: Vec<RedisConn>,
    names: StreamNames,
    block_ms: u64,
}

/// Why the client could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot connect to Redis at {addr}: {source}")]
pub struct ConnectError {
    addr: String,
    #[source]
    source: redis::RedisError,
}

impl RedisStream {
    /// Connects to `addr` (one connection for commands and one per
    /// partition for its reads, each reconnecting on its own). An empty
    /// `XREADGROUP` waits up to `block_ms` for entries.
    ///
    /// # Errors
    /// The address is invalid or Redis cannot be reached.
    pub async fn connect(
        addr: &RedisAddr,
        names: StreamNames,
        block_ms: u64,
        response_timeout: Duration,
    ) -> Result<RedisStream, ConnectError> {
        let err = |source| ConnectError {
            addr: addr.describe(),
            source,
        };
        let read_timeout = response_timeout + Duration::from_millis(block_ms);
        let partitions = names.partitions.len();
        let (conn, readers) = match addr {
            RedisAddr::Server(url) => {
                let client = redis::Client::open(url.as_str()).map_err(err)?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(response_timeout))
                    .set_response_timeout(Some(response_timeout))
                    .set_number_of_retries(2)
                    .set_max_delay(Duration::from_millis(500));
                let conn = ConnectionManager::new_with_config(client.clone(), config.clone())
                    .await
                    .map_err(err)?;
                let reader_config = config.set_response_timeout(Some(read_timeout));
                let mut readers = Vec::with_capacity(partitions);
                for _ in 0..partitions {
                    let reader =
                        ConnectionManager::new_with_config(client.clone(), reader_config.clone())
                            .await
                            .map_err(err)?;
                    readers.push(RedisConn::Server(reader));
                }
                (RedisConn::Server(conn), readers)
            }
            RedisAddr::Cluster(seeds) => {
                // A client per partition's reads, so that each blocking read
                // has node connections of its own. Retries follow MOVED and ASK, and ride out a
                // failover (the replica's promotion takes the node timeout);
                // each command's wait stays bounded by the response timeout.
                let cluster = |timeout: Duration| {
                    redis::cluster::ClusterClient::builder(seeds.iter().map(String::as_str))
                        .connection_timeout(response_timeout)
                        .response_timeout(timeout)
                        .retries(3)
                        .min_retry_wait(100)
                        .max_retry_wait(500)
                        .build()
                };
                let conn = cluster(response_timeout)
                    .map_err(err)?
                    .get_async_connection()
                    .await
                    .map_err(err)?;
                let mut readers = Vec::with_capacity(partitions);
                for _ in 0..partitions {
                    let reader = cluster(read_timeout)
                        .map_err(err)?
                        .get_async_connection()
                        .await
                        .map_err(err)?;
                    readers.push(RedisConn::Cluster(reader));
                }
                (RedisConn::Cluster(conn), readers)
            }
        };
        Ok(RedisStream {
            conn,
            readers,
            names,
            block_ms,
        })
    }

    /// The stream names.
    #[must_use]
    pub fn names(&self) -> &StreamNames {
        &self.names
    }

    /// A connection for other uses (health checks, tests).
    #[must_use]
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    /// `XADD <jobs> * ...`: the twin of `Stream::xadd` (alone, or one of a
    /// pipeline).
    fn xadd(key: &str, entry: &JobEntry) -> Cmd {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(key).arg("*");
        for (k, v) in encode_job(entry) {
            cmd.arg(k).arg(v);
        }
        cmd
    }

    /// `XACK <jobs> <group> <id>...`: the twin of `Stream::xack` (alone, or
    /// one of a pipeline).
    fn xack(&self, key: &str, ids: &[EntryId]) -> Cmd {
        let mut cmd = redis::cmd("XACK");
        cmd.arg(key).arg(&self.names.group);
        for id in ids {
            cmd.arg(id.local().to_string());
        }
        cmd
    }

    /// The pipelined form of `op` (an ack or a publication) on `key`, with
    /// how its answer reads; `None` for any other command.
    fn pipelined(&self, key: &str, op: &StreamOp) -> Option<(Cmd, Parse)> {
        match op {
            StreamOp::Ack { ids } => Some((self.xack(key, ids), (|v| Ok(acked(v))) as Parse)),
            StreamOp::Publish { entry, .. } => Some((Self::xadd(key, entry), added as Parse)),
            _ => None,
        }
    }

    async fn query(&self, cmd: &Cmd) -> Result<Result<Value, StreamError>, Unavailable> {
        let mut conn = self.conn.clone();
        answer(cmd.query_async::<Value>(&mut conn).await)
    }

    /// Sends `pipe` as one round trip: each command's own answer, or
    /// `Unavailable` when the round trip got none.
    async fn pipeline(
        &self,
        pipe: &mut redis::Pipeline,
    ) -> Result<Vec<redis::RedisResult<Value>>, Unavailable> {
        let mut conn = self.conn.clone();
        pipe.ignore_errors()
            .query_async(&mut conn)
            .await
            .map_err(|_| Unavailable)
    }

    /// Runs one command: on its partition's stream, with IDs as Redis
    /// writes them, and the reply's IDs put back in the partition. A
    /// partition this deployment does not have answers as a missing key.
    pub async fn execute(&self, op: StreamOp) -> Result<StreamResult, Unavailable> {
        match op {
            StreamOp::PublishDead { entry, .. } => self.publish_dead(&entry).await,
            StreamOp::Queue { .. } => self.queue().await,
            StreamOp::Publish {
                partition, entry, ..
            } => {
                self.on(partition, async |key| {
                    Ok(self.query(&Self::xadd(key, &entry)).await?.and_then(added))
                })
                .await
            }
            StreamOp::EnsureGroup { partition } => {
                self.on(partition, async |key| self.ensure_group(key).await)
                    .await
            }
            StreamOp::Read {
                partition,
                consumer,
                count,
                ..
            } => {
                self.on(partition, async |key| {
                    self.read(key, partition, &consumer, count).await
                })
                .await
            }
            StreamOp::Ack { ids } => {
                let partition = StreamOp::ack_partition(&ids);
                self.on(partition, async |key| {
                    Ok(self.query(&self.xack(key, &ids)).await?.map(acked))
                })
                .await
            }
            StreamOp::AutoClaim {
                consumer,
                min_idle_ms,
                start,
                count,
                ..
            } => {
                self.on(start.partition, async |key| {
                    self.autoclaim(key, &consumer, min_idle_ms, start, count)
                        .await
                })
                .await
            }
            StreamOp::Touch { consumer, id, .. } => {
                self.on(id.partition, async |key| {
                    self.touch(key, &consumer, id).await
                })
                .await
            }
            StreamOp::Locate { id } => {
                self.on(id.partition, async |key| self.locate(key, id.local()).await)
                    .await
            }
            StreamOp::ForgetConsumers {
                partition, idle_ms, ..
            } => {
                self.on(partition, async |key| {
                    self.forget(FORGET_CONSUMERS, key, idle_ms).await
                })
                .await
            }
            #[cfg(feature = "mutants")]
            StreamOp::DropConsumers {
                partition, idle_ms, ..
            } => {
                self.on(partition, async |key| {
                    self.forget(DROP_CONSUMERS, key, idle_ms).await
                })
                .await
            }
            StreamOp::Retain {
                partition, before, ..
            } => self.retain_all(partition, before).await,
        }
    }

    /// `PublishDead`: XADD to the dead-letter stream.
    async fn publish_dead(&self, entry: &DeadEntry) -> Result<StreamResult, Unavailable> {
        let mut cmd = redis::cmd("XADD");
        cmd.arg(&self.names.dead).arg("*");
        for (k, v) in encode_dead(entry) {
            cmd.arg(k).arg(v);
        }
        Ok(self.query(&cmd).await?.and_then(added))
    }

    /// `EnsureGroup`: XGROUP CREATE ... 0 MKSTREAM, BUSYGROUP an answer
    /// like any other.
    async fn ensure_group(&self, key: &str) -> Result<StreamResult, Unavailable> {
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(key)
            .arg(&self.names.group)
            .arg("0")
            .arg("MKSTREAM");
        Ok(match self.query(&cmd).await? {
            Ok(_) | Err(StreamError::BusyGroup) => Ok(StreamReply::GroupReady),
            Err(e) => Err(e),
        })
    }

    /// `Touch`: XCLAIM ... 0 id JUSTID, the heartbeat's idle reset.
    async fn touch(
        &self,
        key: &str,
        consumer: &str,
        id: EntryId,
    ) -> Result<StreamResult, Unavailable> {
        let mut cmd = redis::cmd("XCLAIM");
        cmd.arg(key)
            .arg(&self.names.group)
            .arg(consumer)
            .arg(0)
            .arg(id.local().to_string())
            .arg("JUSTID");
        Ok(self
            .query(&cmd)
            .await?
            .map(|v| StreamReply::Touched(matches!(v, Value::Array(a) if !a.is_empty()))))
    }

    /// `Read`: XREADGROUP on `partition`'s reader connection, which it
    /// may hold for its whole block.
    async fn read(
        &self,
        key: &str,
        partition: Partition,
        consumer: &str,
        count: usize,
    ) -> Result<StreamResult, Unavailable> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.names.group)
            .arg(consumer)
            .arg("COUNT")
            .arg(count)
            .arg("BLOCK")
            .arg(self.block_ms)
            .arg("STREAMS")
            .arg(key)
            .arg(">");
        let mut reader = self.readers[usize::from(partition)].clone();
        Ok(answer(cmd.query_async::<Value>(&mut reader).await)?.map(read_reply))
    }

    /// Runs `command` on `partition`'s key and puts the reply's IDs in
    /// `partition`. A partition this deployment does not have is an empty
    /// key.
    async fn on(
        &self,
        partition: Partition,
        command: impl AsyncFnOnce(&str) -> Result<StreamResult, Unavailable>,
    ) -> Result<StreamResult, Unavailable> {
        let Some(key) = self.names.key(partition) else {
            return Ok(Err(StreamError::NoGroup));
        };
        Ok(command(key).await?.map(|r| r.in_partition(partition)))
    }
}

impl StreamClient for RedisStream {
    async fn call(&self, op: StreamOp) -> Result<StreamResult, Unavailable> {
        self.execute(op).await
    }

    /// Acknowledgements and publications go out as pipelines (one round
    /// trip; each `XACK` or `XADD` its own command with its own answer):
    /// one for the lot on a single server, one per partition on a cluster,
    /// where a pipeline stays within one slot. Any other mix goes one by
    /// one.
    async fn call_batch(&self, ops: Vec<StreamOp>) -> Result<Vec<StreamResult>, Unavailable> {
        let pipelined: Option<Vec<(Partition, Cmd, Parse)>> = ops
            .iter()
            .map(|op| {
                let p = op.partition()?;
                let (cmd, parse) = self.pipelined(self.names.key(p)?, op)?;
                Some((p, cmd, parse))
            })
            .collect();
        let Some(pipelined) = pipelined else {
            let ids: Option<Vec<EntryId>> = ops
                .iter()
                .map(|op| match op {
                    StreamOp::Locate { id } => Some(*id),
                    _ => None,
                })
                .collect();
            if let Some(ids) = ids {
                return self.locate_many(&ids).await;
            }
            return crate::driver::one_by_one(ops, |op| self.execute(op)).await;
        };
        let apart = matches!(self.conn, RedisConn::Cluster(_));
        let mut groups: Vec<(Partition, Vec<usize>)> = Vec::new();
        for (i, (p, ..)) in pipelined.iter().enumerate() {
            let p = if apart { *p } else { 0 };
            match groups.iter_mut().find(|(q, _)| *q == p) {
                Some((_, members)) => members.push(i),
                None => groups.push((p, vec![i])),
            }
        }
        let sent = futures_util::future::join_all(groups.iter().map(|(_, members)| {
            let mut pipe = redis::pipe();
            for &i in members {
                pipe.add_command(pipelined[i].1.clone());
            }
            async move { self.pipeline(&mut pipe).await }
        }))
        .await;
        let mut out: Vec<Option<StreamResult>> = vec![None; pipelined.len()];
        for ((_, members), replies) in groups.iter().zip(sent) {
            let replies = replies?;
            if replies.len() != members.len() {
                return Err(Unavailable);
            }
            for (&i, r) in members.iter().zip(replies) {
                let (p, _, parse) = &pipelined[i];
                out[i] = Some(answer(r)?.and_then(parse).map(|r| r.in_partition(*p)));
            }
        }
        out.into_iter().map(|r| r.ok_or(Unavailable)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_row_names_its_entry() {
        let row = Value::Array(vec![
            Value::BulkString(b"17-2".to_vec()),
            Value::BulkString(b"c1".to_vec()),
            Value::Int(90_000),
            Value::Int(1),
        ]);
        assert_eq!(first_pending_id(&row), Some(EntryId::new(17, 2)));
        assert_eq!(first_pending_id(&Value::Array(vec![])), None);
        assert_eq!(first_pending_id(&Value::BulkString(b"17-2".to_vec())), None);
    }
}
