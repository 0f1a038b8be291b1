//! An OTLP/HTTP receiver for the tests: it takes `POST /v1/traces` as the
//! OpenTelemetry Collector's OTLP receiver does, decodes each request with
//! the OpenTelemetry project's own protobuf definitions
//! (`opentelemetry-proto`), and keeps the spans. Neither the Collector nor
//! Jaeger is in a registry this project's machines reach (crates.io, PyPI,
//! npm, Debian), so the tests start this one.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use prost::Message as _;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One span as the receiver decoded it.
#[derive(Clone, Debug)]
pub struct SpanSeen {
    /// Its trace.
    pub trace_id: u128,
    /// Its id.
    pub span_id: u64,
    /// Its parent's id (none: a root).
    pub parent: Option<u64>,
    /// Its name.
    pub name: String,
    /// Its process's `pelican.process` (`api`, `worker`).
    pub process: String,
    /// Its attributes, each value as text.
    pub attributes: BTreeMap<String, String>,
    /// Start and end, in ns since the epoch.
    pub times: (u64, u64),
    /// Its status is an error.
    pub error: bool,
}

impl SpanSeen {
    /// Attribute `key`'s value, or "".
    #[must_use]
    pub fn attr(&self, key: &str) -> &str {
        self.attributes.get(key).map_or("", String::as_str)
    }
}

/// The receiver, serving until dropped.
pub struct OtlpSink {
    /// Its base URL (`http://127.0.0.1:<port>`), for `--otlp-endpoint`.
    pub url: String,
    spans: Arc<Mutex<Vec<SpanSeen>>>,
    _runtime: tokio::runtime::Runtime,
}

impl OtlpSink {
    /// Starts one on a free port.
    ///
    /// # Panics
    /// No port.
    #[must_use]
    pub fn start() -> OtlpSink {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let spans = Arc::new(Mutex::new(Vec::new()));
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .expect("a free port");
        let url = format!("http://{}", listener.local_addr().expect("bound"));
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .with_state(spans.clone());
        runtime.spawn(async move { axum::serve(listener, app).await });
        OtlpSink {
            url,
            spans,
            _runtime: runtime,
        }
    }

    /// The spans received so far.
    #[must_use]
    pub fn spans(&self) -> Vec<SpanSeen> {
        self.spans.lock().expect("not poisoned").clone()
    }

    /// The spans, once `enough` holds of them.
    ///
    /// # Panics
    /// Not within `timeout`.
    pub fn wait_for(
        &self,
        timeout: Duration,
        enough: impl Fn(&[SpanSeen]) -> bool,
    ) -> Vec<SpanSeen> {
        let deadline = Instant::now() + timeout;
        loop {
            let spans = self.spans();
            if enough(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "not the spans awaited: {spans:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

async fn receive(
    State(spans): State<Arc<Mutex<Vec<SpanSeen>>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let protobuf = headers
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes() == b"application/x-protobuf");
    if !protobuf {
        return (StatusCode::UNSUPPORTED_MEDIA_TYPE, "protobuf only").into_response();
    }
    let request = match ExportTraceServiceRequest::decode(body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    };
    let mut seen = Vec::new();
    for resource in request.resource_spans {
        let process = resource
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|a| a.key == "pelican.process")
            .map(|a| text(a.value.as_ref().and_then(|v| v.value.as_ref())))
            .unwrap_or_default();
        for span in resource.scope_spans.into_iter().flat_map(|s| s.spans) {
            seen.push(SpanSeen {
                trace_id: u128::from_be_bytes(span.trace_id.try_into().expect("16 bytes")),
                span_id: u64::from_be_bytes(span.span_id.try_into().expect("8 bytes")),
                parent: (!span.parent_span_id.is_empty())
                    .then(|| u64::from_be_bytes(span.parent_span_id.try_into().expect("8 bytes"))),
                name: span.name,
                process: process.clone(),
                attributes: span
                    .attributes
                    .iter()
                    .map(|a| {
                        (
                            a.key.clone(),
                            text(a.value.as_ref().and_then(|v| v.value.as_ref())),
                        )
                    })
                    .collect(),
                times: (span.start_time_unix_nano, span.end_time_unix_nano),
                error: span.status.is_some_and(|s| s.code == 2),
            });
        }
    }
    spans.lock().expect("not poisoned").extend(seen);
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    ([(header::CONTENT_TYPE, "application/x-protobuf")], answer).into_response()
}

/// An attribute's value as text.
fn text(value: Option<&Any>) -> String {
    match value {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        _ => String::new(),
    }
}
