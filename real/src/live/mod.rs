//! The live bindings (feature `live`, on by default): the stream client on
//! Redis, the database client on Postgres, the HTTP API and the metrics.

pub mod api;
pub mod metrics;
pub mod otel;
pub mod pg;
pub mod redis;
pub mod serve;
pub mod watchers;

pub use pg::{PgDb, PgSession, PgTools};
pub use redis::{RedisAddr, RedisConn, RedisStream, StreamNames};
