//! The deployment's settings stored in Postgres: its partition count,
//! which every process must share. A process that read fewer partitions
//! than the others would leave runs in the rest to nobody, and one that
//! published to more would strand them; so the first process to connect
//! stores its count, every later one must match it, and only `pelican
//! partitions --set` changes it, upwards.

use super::args::Connection;
use super::commands::{connect_db, connect_unagreed};
use crate::live::PgDb;
use anyhow::{Result, bail};
use pelican_model::db::query;
use pelican_model::protocol::StreamOp;

/// Agrees this process's `partitions` with the deployment's: stores it if
/// none is stored yet, else refuses to go on with another.
///
/// # Errors
/// A count that differs from the stored one, or Postgres unreachable or
/// not migrated.
pub(crate) async fn agree(db: &PgDb, partitions: u16) -> Result<()> {
    let q = query::AgreePartitions {
        partitions: u32::from(partitions),
    };
    match db.query(q).await {
        Ok(n) if n == u64::from(partitions) => Ok(()),
        Ok(n) => bail!(
            "this deployment has {n} partitions (stored in Postgres), and this process was \
             started with --partitions {partitions}: start it with --partitions {n} \
             (PELICAN_PARTITIONS={n}), or change the deployment's count with \
             `pelican partitions --set {partitions}`"
        ),
        Err(e) => bail!(
            "reading the deployment's partition count from Postgres: {e} \
             (has `pelican migrate` run?)"
        ),
    }
}

/// `pelican partitions [--set N]`.
pub(crate) async fn partitions(c: &Connection, set: Option<u16>) -> Result<()> {
    let Some(n) = set else {
        let db = connect_db(c).await?;
        match db.query(query::ReadPartitions {}).await {
            Ok(0) => println!("no partition count stored yet"),
            Ok(n) => println!("{n}"),
            Err(e) => bail!("reading the partition count from Postgres: {e}"),
        }
        return Ok(());
    };
    let grown = Connection {
        partitions: n,
        ..c.clone()
    };
    let clients = connect_unagreed(&grown, 0).await?;
    for partition in 0..n {
        match clients
            .stream
            .execute(StreamOp::EnsureGroup { partition })
            .await
        {
            Ok(Ok(_)) => {}
            _ => bail!("creating the consumer group of partition {partition} failed"),
        }
    }
    let q = query::SetPartitions {
        partitions: u32::from(n),
    };
    match clients.db.query(q).await {
        Ok(1) => {
            println!(
                "the deployment has {n} partitions: restart every API and worker with --partitions {n}"
            );
            Ok(())
        }
        Ok(_) => bail!(
            "the deployment has more than {n} partitions, and fewer is refused: entries in a \
             dropped partition would be read by no worker"
        ),
        Err(e) => bail!(
            "storing the partition count in Postgres: {e}; nothing is lost, and the command \
             is safe to repeat"
        ),
    }
}
