//! Cron schedules through the API: made, listed, deleted.

use crate::wire::{NewSchedule, Schedule, Schedules};
use crate::{Client, Error};
use reqwest::{Method, StatusCode};

impl Client {
    /// Makes schedule `new.name`, or replaces what it runs and when (it
    /// keeps its history and its ticks' run ids), and answers it with its
    /// next ticks. Sent again after a lost answer, it puts the same.
    ///
    /// # Errors
    /// [`Error::Rejected`] (a bad name, kind, cron expression or time
    /// zone, with the API's reason), [`Error::Unauthorized`],
    /// [`Error::Unavailable`].
    pub async fn put_schedule(&self, new: &NewSchedule) -> Result<Schedule, Error> {
        let body = serde_json::to_value(new).expect("a schedule serializes");
        let answer = self
            .send(Method::POST, "/schedules", Some(&body), None)
            .await?;
        match answer.status {
            StatusCode::OK => answer.decode(),
            _ => Err(answer.error(None)),
        }
    }

    /// Every schedule, by name, with its next ticks and counts.
    ///
    /// # Errors
    /// [`Error::Unauthorized`], [`Error::Unavailable`].
    pub async fn schedules(&self) -> Result<Vec<Schedule>, Error> {
        let answer = self.send(Method::GET, "/schedules", None, None).await?;
        match answer.status {
            StatusCode::OK => Ok(answer.decode::<Schedules>()?.schedules),
            _ => Err(answer.error(None)),
        }
    }

    /// Deletes schedule `name` (its runs stay), answering it as it was;
    /// `None` when there is none of that name.
    ///
    /// # Errors
    /// [`Error::Unauthorized`], [`Error::Unavailable`].
    pub async fn delete_schedule(&self, name: &str) -> Result<Option<Schedule>, Error> {
        let path = format!("/schedules/{name}");
        let answer = self.send(Method::DELETE, &path, None, None).await?;
        match answer.status {
            StatusCode::OK => answer.decode().map(Some),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(answer.error(None)),
        }
    }
}
