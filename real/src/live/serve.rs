//! The API's HTTP server: hyper's HTTP/1 connections, each served by the
//! router, under the bounds `axum::serve` leaves open.
//!
//! * **Connections.** At most `connections_max` at once: the next is
//!   accepted when one closes (the kernel's backlog holds it meanwhile),
//!   so a flood of clients costs the process a bounded number of sockets
//!   and tasks, whatever they send.
//! * **Header reads.** A connection has `header_read` to send each
//!   request's head, from when the server is ready to read it: a client
//!   that trickles a head byte by byte, or keeps a connection open and
//!   idle between requests, is closed then. A response streaming to its
//!   client (an events stream) is not bound: its end is the stream's.
//! * **Shutdown.** When `stop` turns true the listener closes, every
//!   connection finishes the request it is in and closes, and `serve`
//!   returns once they all have (the caller bounds that by its grace).

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// The server's bounds (`pelican api --connections-max`,
/// `--header-read-timeout-ms`).
#[derive(Clone, Copy, Debug)]
pub struct Bounds {
    /// Connections served at once.
    pub connections_max: usize,
    /// How long a connection may take to send a request's head.
    pub header_read: Duration,
}

/// Serves `app` on `listener` within `bounds` until `stop` is true, then
/// drains the connections (see the module's documentation).
pub async fn serve(
    listener: TcpListener,
    app: Router,
    bounds: Bounds,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(Semaphore::new(bounds.connections_max.max(1)));
    let graceful = GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(bounds.header_read);
    loop {
        let permit = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let tcp = tokio::select! {
            biased;
            _ = stop.wait_for(|s| *s) => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    // Out of descriptors, say: the next accept may do.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(tcp), service));
        tokio::spawn(async move {
            // A connection's error is its client's (a reset, a head too
            // slow): nothing to do but close it.
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
