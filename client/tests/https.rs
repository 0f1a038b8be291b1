//! The client over `https://`: a TLS server of the test's own, with a
//! certificate for `localhost` that a test authority signed
//! (`tests/tls/`: made with `openssl`, valid for a hundred years; the key
//! is a test key and protects nothing). The server answers the first
//! submission with 503 and the second with the run, so the test also sees
//! the retry carry the same idempotency key.

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use pelican_client::{Client, Error, Retry, RunId, Submit};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

const CA: &[u8] = include_bytes!("tls/ca.pem");
const CERT: &[u8] = include_bytes!("tls/server.pem");
const KEY: &[u8] = include_bytes!("tls/server.key");

/// What the server saw: each request's method, path and idempotency key.
type Seen = Arc<Mutex<Vec<(String, String, Option<String>)>>>;

/// Serves TLS on a free port of 127.0.0.1; its address and what it saw.
async fn server() -> (u16, Seen) {
    let certs = CertificateDer::pem_slice_iter(CERT)
        .collect::<Result<Vec<_>, _>>()
        .expect("the test certificate");
    let key = PrivateKeyDer::from_pem_slice(KEY).expect("the test key");
    let config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .expect("a server certificate");
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let port = listener.local_addr().expect("bound").port();
    let seen = Seen::default();
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, log) = (acceptor.clone(), log.clone());
            tokio::spawn(async move {
                // A client that refuses the certificate ends the handshake.
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let serve = service_fn(move |req| answer(req, log.clone()));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), serve)
                    .await;
            });
        }
    });
    (port, seen)
}

/// The first submission: 503; later ones: run 7, queued. A read of run 7:
/// 404.
async fn answer(
    req: Request<Incoming>,
    seen: Seen,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|k| k.to_str().ok())
        .map(str::to_owned);
    let (method, path) = (req.method().to_string(), req.uri().path().to_owned());
    let _ = req.into_body().collect().await;
    let submissions = {
        let mut seen = seen.lock().expect("not poisoned");
        seen.push((method.clone(), path.clone(), key));
        seen.iter().filter(|(m, _, _)| m == "POST").count()
    };
    let (status, body) = match (method.as_str(), path.as_str()) {
        ("POST", "/runs") if submissions == 1 => (503, r#"{"error":"Postgres is unavailable"}"#),
        ("POST", "/runs") => (202, r#"{"run_id":7,"status":"queued","published":true}"#),
        _ => (404, r#"{"error":"no run 7"}"#),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = StatusCode::from_u16(status).expect("a status");
    Ok(response)
}

fn quick() -> Retry {
    Retry {
        attempts: 3,
        backoff: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
        timeout: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn the_client_speaks_https_to_a_server_its_roots_trust() {
    let (port, seen) = server().await;
    let client = Client::new(&format!("https://localhost:{port}"))
        .expect("an https address")
        .with_root_certificate(CA)
        .expect("the test authority")
        .with_retry(quick());
    let run = client
        .submit(&Submit::new("email", serde_json::json!({})).key("k-1"))
        .await
        .expect("accepted on the second send");
    assert_eq!(run.run_id, RunId(7));
    assert!(matches!(
        client.run(RunId(7)).await,
        Err(Error::NotFound(RunId(7)))
    ));
    let seen = seen.lock().expect("not poisoned").clone();
    let keys: Vec<_> = seen.iter().filter(|(m, _, _)| m == "POST").collect();
    assert_eq!(keys.len(), 2, "one retry after the 503: {seen:?}");
    assert!(
        keys.iter().all(|(_, _, k)| k.as_deref() == Some("k-1")),
        "the retry carries the same key: {seen:?}"
    );
}

#[tokio::test]
async fn a_certificate_no_root_vouches_for_is_refused() {
    let (port, seen) = server().await;
    let client = Client::new(&format!("https://localhost:{port}"))
        .expect("an https address")
        .with_retry(quick());
    let answer = client.run(RunId(7)).await;
    assert!(
        matches!(answer, Err(Error::Unavailable(_))),
        "the handshake fails, so no request is made: {answer:?}"
    );
    assert!(seen.lock().expect("not poisoned").is_empty());
}

#[test]
fn only_http_and_https_addresses_are_taken() {
    assert!(Client::new("https://api.example.com").is_ok());
    assert!(matches!(Client::new("ftp://x"), Err(Error::Address(_))));
    assert!(matches!(
        Client::new("localhost:8080"),
        Err(Error::Address(_))
    ));
    assert!(matches!(
        Client::new("http://x").and_then(|c| c.with_root_certificate(b"not a certificate")),
        Err(Error::Address(_))
    ));
}
