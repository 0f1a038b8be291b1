//! `pelican schedule`: cron schedules, straight on Postgres with the API's
//! own checks and statements.

use super::args::{Connection, ScheduleCmd};
use super::commands::connect_db;
use super::output;
use crate::live::api;
use anyhow::{Context, Result, bail};
use pelican_client::wire;
use pelican_model::db::query;

/// Runs `cmd`.
pub(crate) async fn run(c: &Connection, cmd: ScheduleCmd, json: bool) -> Result<()> {
    let db = connect_db(c).await?;
    let views = async |db| {
        api::schedules_view(db)
            .await
            .map_err(|e| anyhow::anyhow!("{e:?}"))
    };
    match cmd {
        ScheduleCmd::Put {
            name,
            kind,
            cron,
            input,
            tz,
            overlap,
            catchup,
        } => {
            let input = serde_json::from_str(&input).context("the input is not JSON")?;
            let new = wire::NewSchedule {
                name,
                kind,
                input,
                cron,
                tz,
                overlap,
                catchup,
            };
            let put = api::put_schedule(&new).map_err(anyhow::Error::msg)?;
            db.query(put).await?;
            let all = views(&db).await?;
            let made = all.schedules.iter().find(|s| s.spec.name == new.name);
            let made = made.context("the schedule was deleted meanwhile")?;
            output::show(json, made, output::schedule);
        }
        ScheduleCmd::List => output::show(json, &views(&db).await?, output::schedules),
        ScheduleCmd::Delete { name } => {
            let all = views(&db).await?;
            let Some(was) = all.schedules.into_iter().find(|s| s.spec.name == name) else {
                bail!("no schedule {name:?}");
            };
            if db
                .query(query::DeleteSchedule { name: name.clone() })
                .await?
                == 0
            {
                bail!("no schedule {name:?}");
            }
            output::show(json, &was, output::schedule);
        }
    }
    Ok(())
}
