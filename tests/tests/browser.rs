//! The dashboard in a real browser: Debian's headless Chromium, driven over
//! WebDriver (chromedriver, fantoccini), against a real API and real
//! workers on throwaway Redis and Postgres. It clicks through what an
//! operator does: give the token, submit a run, watch it run, kill its
//! worker and watch it reclaimed under a new fence on the timeline (a lane
//! per worker: the claim, the takeover, the lease), see it succeed; cancel
//! a run; requeue a dead one; find runs by id and by idempotency key;
//! requeue every dead run of a kind in bulk after confirming the count;
//! read the last hour's figures. Screenshots go to
//! `target/test-artefacts/dashboard/`.
#![allow(
    clippy::too_many_lines,
    reason = "a scenario, bench or check reads top to bottom as one script"
)]

use fantoccini::{Client, ClientBuilder, Locator};
use pelican_model::ids::RunId;
use pelican_tests::{Env, rt};
use std::future::Future;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// chromedriver on a port of its own, killed when dropped.
struct Driver {
    child: Child,
    port: u16,
    profile: PathBuf,
}

impl Driver {
    fn start() -> Driver {
        let port = pelican_tests::free_port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start chromedriver ({e}): install Debian's chromium and \
                     chromium-driver (.ci/run does)"
                )
            });
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "chromedriver did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        let profile = std::env::temp_dir().join(format!("pelican-chromium-{port}"));
        Driver {
            child,
            port,
            profile,
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

async fn browser(driver: &Driver) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": "/usr/bin/chromium",
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1280,1100",
                format!("--user-data-dir={}", driver.profile.display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{}", driver.port))
        .await
        .expect("chromium starts under chromedriver")
}

/// Waits up to 40 s for `ok` to answer `Some`.
async fn until<T, F, Fut>(what: &str, mut ok: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        if let Some(v) = ok().await {
            return v;
        }
        assert!(Instant::now() < deadline, "{what}: not within 40 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn text(c: &Client, css: &str) -> Option<String> {
    c.find(Locator::Css(css)).await.ok()?.text().await.ok()
}

async fn attr(c: &Client, css: &str, name: &str) -> Option<String> {
    c.find(Locator::Css(css))
        .await
        .ok()?
        .attr(name)
        .await
        .ok()?
}

async fn fill(c: &Client, css: &str, value: &str) {
    let e = c.find(Locator::Css(css)).await.expect(css);
    e.clear().await.expect("cleared");
    e.send_keys(value).await.expect("typed");
}

/// Clicks `css` once it is there. The page re-renders as it polls, so an
/// element found just before a render is stale by the click (WebDriver's
/// stale element reference, and no click): it is found again.
async fn click(c: &Client, css: &str) {
    until(css, || async {
        c.find(Locator::Css(css)).await.ok()?.click().await.ok()
    })
    .await;
}

fn artefacts() -> PathBuf {
    let dir = pelican_tests::deploy::root().join("target/test-artefacts/dashboard");
    std::fs::create_dir_all(&dir).expect("the artefacts directory");
    dir
}

async fn shot(c: &Client, name: &str) {
    let png = c.screenshot().await.expect("a screenshot");
    std::fs::write(artefacts().join(format!("{name}.png")), png).expect("saved");
}

/// Submits `kind` with `input` from the queue page and answers the run's
/// id, once its page shows.
async fn submit(c: &Client, base: &str, kind: &str, input: &str) -> u64 {
    c.goto(&format!("{base}/#/")).await.expect("the queue page");
    until("the submit form", || async {
        c.find(Locator::Css("#submit-kind")).await.ok()
    })
    .await;
    fill(c, "#submit-kind", kind).await;
    fill(c, "#submit-input", input).await;
    click(c, "#submit").await;
    until("the run's page", || async {
        let url = c.current_url().await.ok()?;
        let id = url.fragment()?.strip_prefix("/runs/")?.parse().ok()?;
        text(c, "#run-status").await.filter(|s| !s.is_empty())?;
        Some(id)
    })
    .await
}

async fn status_is(c: &Client, want: &str) {
    until(&format!("the run shows {want}"), || async {
        (text(c, "#run-status").await? == want).then_some(())
    })
    .await;
}

/// Submits a no-op under idempotency key `key` through the API, for the
/// search to find; answers its run.
fn submit_keyed(base: &str, key: &str) -> u64 {
    pelican_tests::agent()
        .post(&format!("{base}/runs"))
        .header("Authorization", "Bearer tok")
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .send(r#"{"kind":"noop","input":{}}"#)
        .expect("submitted")
        .body_mut()
        .read_json::<serde_json::Value>()
        .expect("its answer")["run_id"]
        .as_u64()
        .expect("a run id")
}

#[test]
fn the_dashboard_follows_a_run_through_a_reclaim() {
    let mut env = Env::new();
    let (_api, base) = env.api_with_flags("tok", 3, &[]);
    let mut first = env.worker(1, None, &[]);
    let driver = Driver::start();
    rt().block_on(async {
        let c = browser(&driver).await;
        c.goto(&format!("{base}/"))
            .await
            .expect("the dashboard loads");
        fill(&c, "#token", "tok").await;
        click(&c, "#use-token").await;
        until("the queue's figures", || async {
            text(&c, "#queue-length").await.filter(|t| !t.is_empty())
        })
        .await;
        assert_eq!(text(&c, "#conn").await.as_deref(), Some("connected"));
        shot(&c, "01-queue").await;

        // Submit a long run; it runs on the first worker.
        let run = submit(&c, &base, "sleep", r#"{"ms":6000}"#).await;
        status_is(&c, "running").await;
        let fence1: u64 = until("attempt 1", || async {
            attr(&c, "#attempts li[data-attempt='1']", "data-fence")
                .await?
                .parse()
                .ok()
        })
        .await;
        let worker1 = text(&c, "#attempts li[data-attempt='1'] .worker").await;
        assert_eq!(worker1.as_deref(), Some("w1"));
        shot(&c, "02-running").await;

        // Kill its worker: another reclaims it under a new fence.
        first.kill9();
        let _second = env.worker(2, None, &[]);
        let fence2: u64 = until("attempt 2, after the reclaim", || async {
            attr(&c, "#attempts li[data-attempt='2']", "data-fence")
                .await?
                .parse()
                .ok()
        })
        .await;
        assert!(
            fence2 > fence1,
            "the reclaim's fence {fence2} is above {fence1}"
        );
        assert_eq!(
            text(&c, "#attempts li[data-attempt='2'] .worker")
                .await
                .as_deref(),
            Some("w2")
        );
        shot(&c, "03-reclaimed").await;
        // The timeline: attempt 1 on w1's lane, ended by the takeover;
        // attempt 2 on w2's, running, its lease ahead of it.
        let ended = attr(
            &c,
            "#timeline .lane[data-worker='w1'] .bar[data-attempt='1']",
            "data-end",
        )
        .await;
        assert_eq!(ended.as_deref(), Some("taken-over"));
        until("the takeover's mark", || async {
            c.find(Locator::Css(
                "#timeline .lane[data-worker='w1'] .mark[data-takeover='1']",
            ))
            .await
            .ok()
        })
        .await;
        until("attempt 2 running on w2's lane, with its lease", || async {
            c.find(Locator::Css(
                "#timeline .lane[data-worker='w2'] .lease[data-lease='2']",
            ))
            .await
            .ok()
        })
        .await;
        shot(&c, "03b-timeline").await;
        status_is(&c, "succeeded").await;
        until("attempt 2 ends in success on the timeline", || async {
            let end = attr(
                &c,
                "#timeline .lane[data-worker='w2'] .bar[data-attempt='2']",
                "data-end",
            )
            .await?;
            (end == "succeeded").then_some(())
        })
        .await;
        let events = until("the events, live", || async {
            let rows = c
                .find_all(Locator::Css("#events tr[data-seq]"))
                .await
                .ok()?;
            let mut kinds = Vec::new();
            for r in rows {
                kinds.push(
                    r.find(Locator::Css(".pill"))
                        .await
                        .ok()?
                        .text()
                        .await
                        .ok()?,
                );
            }
            kinds
                .last()
                .is_some_and(|k| k == "succeeded")
                .then_some(kinds)
        })
        .await;
        assert_eq!(
            events.iter().filter(|k| *k == "claimed").count(),
            2,
            "two claims, then the success: {events:?}"
        );
        shot(&c, "04-succeeded").await;

        // Cancel a run from its page.
        let cancelled = submit(&c, &base, "sleep", r#"{"ms":60000}"#).await;
        click(&c, "#cancel").await;
        status_is(&c, "cancelled").await;
        shot(&c, "05-cancelled").await;

        // A dead run, requeued from its page: it runs again (and dies again).
        let dead = submit(&c, &base, "fail", r#"{"class":"retryable","times":99}"#).await;
        status_is(&c, "dead").await;
        shot(&c, "06-dead").await;
        click(&c, "#requeue").await;
        until("the requeued attempt", || async {
            c.find(Locator::Css("#attempts li[data-attempt='4']"))
                .await
                .ok()
        })
        .await;
        status_is(&c, "dead").await;

        // Search: a run by its id, and one by its idempotency key.
        fill(&c, "#search-q", &cancelled.to_string()).await;
        click(&c, "#search-go").await;
        until("the run found by id", || async {
            (text(&c, "#run-id").await? == cancelled.to_string()).then_some(())
        })
        .await;
        let keyed = submit_keyed(&base, "order-7");
        env.accepted.insert(RunId(keyed));
        fill(&c, "#search-q", "order-7").await;
        click(&c, "#search-go").await;
        until("the run found by key", || async {
            (text(&c, "#run-id").await? == keyed.to_string()).then_some(())
        })
        .await;
        shot(&c, "08-found-by-key").await;

        // Bulk: requeue every dead `fail`, after confirming the count.
        c.goto(&format!("{base}/#/dead-letters"))
            .await
            .expect("the dead letters");
        fill(&c, "#requeue-kind", "fail").await;
        click(&c, "#requeue-all").await;
        let count = until("the count to confirm", || async {
            text(&c, "#bulk-count").await
        })
        .await;
        assert_eq!(count, "1", "one dead run of kind fail");
        shot(&c, "09-bulk-confirm").await;
        click(&c, "#bulk-yes").await;
        let changed = until("the bulk requeue's answer", || async {
            text(&c, "#bulk-changed").await
        })
        .await;
        assert_eq!(changed, "1");
        shot(&c, "10-bulk-done").await;
        c.goto(&format!("{base}/#/runs/{dead}"))
            .await
            .expect("the dead run");
        until("the bulk requeue's attempt", || async {
            c.find(Locator::Css("#attempts li[data-attempt='5']"))
                .await
                .ok()
        })
        .await;
        status_is(&c, "dead").await;

        // The queue page lists all three, filtered by status.
        c.goto(&format!("{base}/#/")).await.expect("the queue page");
        until("the runs table", || async {
            c.find(Locator::Css(&format!("#runs-table tr[data-run='{run}']")))
                .await
                .ok()
        })
        .await;
        for (id, status) in [(run, "succeeded"), (cancelled, "cancelled"), (dead, "dead")] {
            let shown = text(&c, &format!("#runs-table tr[data-run='{id}'] .pill")).await;
            assert_eq!(shown.as_deref(), Some(status), "run {id}");
        }
        shot(&c, "07-runs").await;
        let finished = until("the last hour's figures", || async {
            text(&c, "#hour-finished").await?.parse::<u64>().ok()
        })
        .await;
        assert!(
            finished >= 3,
            "the hour counts the finished runs: {finished}"
        );

        // Schedules: one made in the form shows its next ticks; a bad
        // expression is refused with the API's reason; Delete asks again.
        c.goto(&format!("{base}/#/schedules"))
            .await
            .expect("the schedules page");
        for (css, value) in [
            ("#schedule-name", "nightly"),
            ("#schedule-kind", "noop"),
            ("#schedule-cron", "0 3 * * *"),
            ("#schedule-tz", "Europe/Berlin"),
        ] {
            fill(&c, css, value).await;
        }
        click(&c, "#schedule-put").await;
        let ticks = until("the schedule's next ticks", || async {
            text(
                &c,
                "#schedules-table tr[data-schedule='nightly'] .next-ticks",
            )
            .await
        })
        .await;
        assert_eq!(ticks.lines().count(), 3, "three next ticks: {ticks}");
        shot(&c, "11-schedules").await;
        fill(&c, "#schedule-name", "broken").await;
        fill(&c, "#schedule-cron", "61 * * * *").await;
        click(&c, "#schedule-put").await;
        let error = until("the refusal", || async {
            text(&c, "#error").await.filter(|e| !e.is_empty())
        })
        .await;
        assert!(error.contains("invalid cron expression"), "{error}");
        let delete = "#schedules-table tr[data-schedule='nightly'] button";
        click(&c, delete).await;
        until("the second ask", || async {
            (text(&c, delete).await? == "Really delete").then_some(())
        })
        .await;
        click(&c, delete).await;
        until("the schedule gone", || async {
            text(&c, "#schedules")
                .await?
                .contains("No schedules")
                .then_some(())
        })
        .await;
        c.close().await.expect("the browser closes");
    });
    env.settle();
    env.check(&[]);
}
