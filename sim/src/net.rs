//! The simulated servers (Redis, Postgres, the tool service) and the client
//! the driver talks to them with, over madsim's network.
//!
//! A server is a loop on its own node: it takes one request at a time (as
//! Redis and a single Postgres connection do), applies it to the oracle's
//! world, and answers. While faults are on it may lose a request before
//! applying it or a reply after. Killing a server's node drops its
//! in-flight requests; the network may delay or drop messages on clogged
//! links. A client that hears nothing within the driver's call timeout gets
//! `Unavailable`, exactly as the live bindings do.

use crate::oracle::{Shared, lock};
use madsim::net::Endpoint;
use pelican_model::ids::{Fence, RunId};
use pelican_model::protocol::{DbOp, DbReply, StreamOp, Unavailable};
use pelican_model::world::Issuer;
use pelican_real::driver::BoxFuture;
use pelican_real::{DbClient, StreamClient, StreamResult, Tools};
use std::net::SocketAddr;
use std::sync::Arc;

/// The tag requests are sent under (replies use a fresh random tag each).
const REQUEST: u64 = 1;

/// Redis's address.
pub const REDIS: &str = "10.0.0.1:6379";
/// Postgres's address.
pub const POSTGRES: &str = "10.0.0.2:5432";
/// The tool service's address.
pub const TOOLS: &str = "10.0.0.3:8080";
/// The address of the service outside Pelican that users' handlers call
/// ([`crate::harness::External`]).
pub const EXTERNAL: &str = "10.0.0.4:8080";

/// A request to one of the servers.
#[derive(Debug)]
pub enum Request {
    /// To Postgres.
    Db(DbOp, Issuer),
    /// To Postgres: a batch ([`pelican_model::Db::execute_batch`]), in one
    /// request.
    DbBatch(Vec<(DbOp, Issuer)>),
    /// To Redis.
    Stream(StreamOp),
    /// To Redis: a pipeline, each command on its own, back to back.
    StreamBatch(Vec<StreamOp>),
    /// To the tool service.
    Effect {
        /// The run.
        run: RunId,
        /// Its tool call.
        call: u32,
        /// The fence of the attempt sending it.
        fence: Fence,
        /// The idempotency key.
        key: String,
    },
    /// To the external service.
    External(ExternalCall),
}

/// A request to the external service users' handlers call.
#[derive(Clone, Debug)]
pub struct ExternalCall {
    /// The run whose job sends it.
    pub run: RunId,
    /// What the job calls it ("charge", "model").
    pub name: String,
    /// A side effect's idempotency key (`None` for a query, or for an
    /// effect sent without one).
    pub key: Option<String>,
    /// Whether it is a side effect (applied once per key) or a query.
    pub effect: bool,
    /// The request body.
    pub body: String,
}

/// A server's answer.
#[derive(Debug)]
pub enum Reply {
    /// From Postgres.
    Db(DbReply),
    /// From Postgres, for a batch.
    DbBatch(Vec<DbReply>),
    /// From Redis.
    Stream(StreamResult),
    /// From Redis, for a pipeline.
    StreamBatch(Vec<StreamResult>),
    /// From the tool service: applied now?
    Effect(bool),
    /// From the external service.
    External(String),
}

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("constant addresses parse")
}

/// Serves requests on `listen` until the node is killed. `name` labels the
/// server's events.
pub async fn serve(oracle: Shared, listen: &'static str, name: &'static str) {
    let ep = Endpoint::bind(addr(listen))
        .await
        .expect("a fresh node can bind its address");
    loop {
        let Ok((payload, from)) = ep.recv_from_raw(REQUEST).await else {
            continue;
        };
        let Ok(boxed) = payload.downcast::<(u64, String, Request)>() else {
            continue;
        };
        let (tag, client, request) = *boxed;
        let reply = {
            let mut o = lock(&oracle);
            if o.faulty && madsim::rand::random::<f64>() < o.faults.lost_request_p {
                o.count("lost_requests");
                let r = format!("{request:?}");
                o.note(name, format!("lost request from {client}: {r}"));
                continue;
            }
            let node = format!("{name}<{client}");
            let reply = match request {
                Request::Db(op, by) => Reply::Db(o.db(&node, &op, by)),
                Request::DbBatch(ops) => {
                    o.count("batches");
                    Reply::DbBatch(
                        ops.into_iter()
                            .map(|(op, by)| o.db(&node, &op, by))
                            .collect(),
                    )
                }
                Request::Stream(op) => Reply::Stream(o.stream(&node, &op)),
                Request::StreamBatch(ops) => {
                    o.count("pipelines");
                    Reply::StreamBatch(ops.iter().map(|op| o.stream(&node, op)).collect())
                }
                Request::Effect {
                    run,
                    call,
                    fence,
                    key,
                } => Reply::Effect(o.effect(&node, run, call, fence, &key)),
                Request::External(call) => Reply::External(o.external(&node, &call)),
            };
            if o.faulty && madsim::rand::random::<f64>() < o.faults.lost_reply_p {
                o.count("lost_replies");
                o.note(name, format!("lost the reply to {client}"));
                continue;
            }
            reply
        };
        let _ = ep.send_to_raw(from, tag, Box::new(reply)).await;
    }
}

/// Keeps Redis's "AOF" in step: every second, what Redis holds now is what
/// a restart would recover (appendfsync everysec).
pub async fn fsync_every_second(oracle: Shared) {
    loop {
        madsim::time::sleep(std::time::Duration::from_secs(1)).await;
        let mut o = lock(&oracle);
        o.fsynced = o.world.redis.clone();
    }
}

/// A node's client of the three servers.
#[derive(Clone)]
pub struct Client {
    ep: Arc<Endpoint>,
    name: String,
}

impl Client {
    /// Binds a client endpoint on the current node.
    pub async fn bind(name: &str) -> Client {
        let ep = Endpoint::bind("0.0.0.0:0")
            .await
            .expect("a node can bind an ephemeral port");
        Client {
            ep: Arc::new(ep),
            name: name.to_owned(),
        }
    }

    /// Sends `request` to the server at `to` and waits for its reply.
    pub(crate) async fn call(
        &self,
        to: &'static str,
        request: Request,
    ) -> Result<Reply, Unavailable> {
        let tag = madsim::rand::random::<u64>() | 1 << 63;
        let payload = Box::new((tag, self.name.clone(), request));
        self.ep
            .send_to_raw(addr(to), REQUEST, payload)
            .await
            .map_err(|_| Unavailable)?;
        let (reply, _) = self.ep.recv_from_raw(tag).await.map_err(|_| Unavailable)?;
        reply
            .downcast::<Reply>()
            .map(|r| *r)
            .map_err(|_| Unavailable)
    }
}

impl StreamClient for Client {
    async fn call(&self, op: StreamOp) -> Result<StreamResult, Unavailable> {
        match Client::call(self, REDIS, Request::Stream(op)).await? {
            Reply::Stream(r) => Ok(r),
            _ => Err(Unavailable),
        }
    }

    async fn call_batch(&self, ops: Vec<StreamOp>) -> Result<Vec<StreamResult>, Unavailable> {
        match Client::call(self, REDIS, Request::StreamBatch(ops)).await? {
            Reply::StreamBatch(r) => Ok(r),
            _ => Err(Unavailable),
        }
    }
}

/// The checker's wrapper: each statement goes to the simulated Postgres
/// with who issued it, which the world's S3 check needs (a binding drops
/// it, [`DbClient::call_as`]); a statement sent without one
/// ([`DbClient::call`]) is nobody's in particular.
impl DbClient for Client {
    async fn call(&self, op: DbOp) -> Result<DbReply, Unavailable> {
        self.call_as(op, Issuer::default()).await
    }

    async fn call_batch(&self, ops: Vec<DbOp>) -> Result<Vec<DbReply>, Unavailable> {
        let ops = ops.into_iter().map(|op| (op, Issuer::default())).collect();
        self.call_batch_as(ops).await
    }

    async fn call_as(&self, op: DbOp, by: Issuer) -> Result<DbReply, Unavailable> {
        match Client::call(self, POSTGRES, Request::Db(op, by)).await? {
            Reply::Db(r) => Ok(r),
            _ => Err(Unavailable),
        }
    }

    async fn call_batch_as(&self, ops: Vec<(DbOp, Issuer)>) -> Result<Vec<DbReply>, Unavailable> {
        match Client::call(self, POSTGRES, Request::DbBatch(ops)).await? {
            Reply::DbBatch(r) => Ok(r),
            _ => Err(Unavailable),
        }
    }
}

impl Tools for Client {
    fn apply(
        &self,
        run: RunId,
        call: u32,
        fence: Fence,
        key: String,
    ) -> BoxFuture<Result<bool, Unavailable>> {
        let me = self.clone();
        Box::pin(async move {
            match Client::call(
                &me,
                TOOLS,
                Request::Effect {
                    run,
                    call,
                    fence,
                    key,
                },
            )
            .await?
            {
                Reply::Effect(applied) => Ok(applied),
                _ => Err(Unavailable),
            }
        })
    }
}
