//! OpenTelemetry traces, exported as OTLP over HTTP/protobuf
//! (`--otlp-endpoint`; off by default, and then none of this runs).
//!
//! A run's trace ([`RunTrace`]) holds the span of its submission (made by
//! the API), one span per attempt (made by the worker that ran it, from
//! the claim to the delivery's end) and one per step the attempt ran. The
//! ids come from [`crate::telemetry`], so no process tells another which
//! span is whose. Spans carry ids, names, numbers and outcomes: never an
//! input, a result or an error message.
//!
//! The worker sees its attempts through the driver's probe and its steps
//! through the step hook; spans are queued to the SDK's batch processor,
//! which exports them from a thread of its own.

use crate::driver::{BoxFuture, Probe, RoleId};
use crate::jobs::{StepBoundary, StepHook};
use crate::telemetry::RunTrace;
use anyhow::{Context as _, Result};
use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};
use pelican_model::ids::{EntryId, Fence, RunId, WorkerId};
use pelican_model::protocol::{DeliveryEnd, Execution};
use pelican_model::status::JobOutcome;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// The exporter of one process: cheap to clone, shared by its tasks.
#[derive(Clone)]
pub struct Otel {
    inner: Arc<Inner>,
}

struct Inner {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    /// Each running attempt, by its run and fence.
    attempts: Mutex<HashMap<(RunId, Fence), Attempt>>,
    /// Which attempt each delivery runs.
    deliveries: Mutex<HashMap<(WorkerId, EntryId), (RunId, Fence)>>,
    /// Each step whose body runs, by run, fence and step.
    steps: Mutex<HashMap<StepKey, (SystemTime, String)>>,
}

/// A step of an attempt: its run, the attempt's fence, its number.
type StepKey = (RunId, Fence, u32);

/// An attempt whose span is open.
struct Attempt {
    trace: RunTrace,
    kind: String,
    attempt: u32,
    worker: WorkerId,
    start: SystemTime,
    outcome: Option<JobOutcome>,
}

impl Otel {
    /// An exporter to `endpoint` (`http://host:4318`; a URL without a path
    /// gets the traces path, `/v1/traces`), for process `process` (`api`,
    /// `worker`).
    ///
    /// # Errors
    /// The endpoint is not a URL.
    pub fn new(endpoint: &str, process: &'static str) -> Result<Otel> {
        use opentelemetry_otlp::{Protocol, WithExportConfig as _};
        let url = traces_url(endpoint)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(Duration::from_secs(10))
            .build()
            .context("building the OTLP exporter")?;
        // A worker makes a few spans per run at thousands of runs a second:
        // a queue of the SDK's default (2,048) would drop them.
        let batch = BatchConfigBuilder::default()
            .with_max_queue_size(65_536)
            .with_max_export_batch_size(2_048)
            .with_scheduled_delay(Duration::from_millis(500))
            .build();
        let processor = BatchSpanProcessor::builder(exporter)
            .with_batch_config(batch)
            .build();
        let resource = opentelemetry_sdk::Resource::builder_empty()
            .with_service_name("pelican")
            .with_attribute(KeyValue::new("pelican.process", process))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("pelican");
        Ok(Otel {
            inner: Arc::new(Inner {
                provider,
                tracer,
                attempts: Mutex::default(),
                deliveries: Mutex::default(),
                steps: Mutex::default(),
            }),
        })
    }

    /// Sends what is queued and stops the exporter (at shutdown).
    pub fn shutdown(&self) {
        if let Err(e) = self.inner.provider.shutdown() {
            tracing::warn!(error = %e, "stopping the OTLP exporter");
        }
    }

    /// The span of a stored run's submission, `submit {kind}`, whose id its
    /// stored `traceparent` names (`trace.parent_id`), a child of the
    /// caller's span `caller` if there was one.
    pub fn submitted(
        &self,
        trace: &RunTrace,
        caller: Option<u64>,
        kind: &str,
        (start, end): (SystemTime, SystemTime),
    ) {
        let Some(id) = trace.parent_id else { return };
        let attributes = vec![
            KeyValue::new("pelican.run", run_attr(trace.run)),
            KeyValue::new("pelican.kind", kind.to_owned()),
        ];
        let status = Status::Ok;
        let span = Span {
            name: format!("submit {kind}"),
            kind: SpanKind::Producer,
            id,
            parent: caller,
            times: (start, end),
            attributes,
            status,
        };
        self.emit(trace, span);
    }

    /// Exports `span` of the run `trace`.
    fn emit(&self, trace: &RunTrace, span: Span) {
        let tracer = &self.inner.tracer;
        let parent = match span.parent {
            Some(p) => Context::new().with_remote_span_context(SpanContext::new(
                TraceId::from(trace.trace_id),
                SpanId::from_bytes(p.to_be_bytes()),
                if trace.sampled {
                    TraceFlags::SAMPLED
                } else {
                    TraceFlags::default()
                },
                true,
                TraceState::default(),
            )),
            None => Context::new(),
        };
        let mut builder = tracer
            .span_builder(span.name)
            .with_kind(span.kind)
            .with_start_time(span.times.0)
            .with_attributes(span.attributes)
            .with_status(span.status);
        builder.trace_id = Some(TraceId::from(trace.trace_id));
        builder.span_id = Some(SpanId::from_bytes(span.id.to_be_bytes()));
        let mut made = builder.start_with_context(tracer, &parent);
        opentelemetry::trace::Span::end_with_timestamp(&mut made, span.times.1);
    }

    /// Ends the attempt `key`'s span (and those of its steps that never
    /// recorded) as its delivery ended with `end`.
    fn attempt_ended(&self, key: (RunId, Fence), end: DeliveryEnd) {
        let Some(a) = lock(&self.inner.attempts).remove(&key) else {
            return;
        };
        let now = SystemTime::now();
        let (outcome, status, class) = match &a.outcome {
            Some(JobOutcome::Succeeded { .. }) => ("succeeded", Status::Ok, None),
            Some(JobOutcome::Failed { class, .. }) => (
                "failed",
                Status::error(class.as_str()),
                Some(class.as_str()),
            ),
            None => ("stopped", Status::error("stopped"), None),
        };
        let mut attributes = vec![
            KeyValue::new("pelican.run", run_attr(key.0)),
            KeyValue::new("pelican.kind", a.kind.clone()),
            KeyValue::new("pelican.attempt", i64::from(a.attempt)),
            KeyValue::new("pelican.fence", i64::try_from(key.1.0).unwrap_or(i64::MAX)),
            KeyValue::new("pelican.worker", a.worker.consumer()),
            KeyValue::new("pelican.outcome", outcome),
            KeyValue::new("pelican.delivery", end.name()),
        ];
        if let Some(class) = class {
            attributes.push(KeyValue::new("pelican.error_class", class));
        }
        let span = Span {
            name: format!("attempt {}", a.kind),
            kind: SpanKind::Consumer,
            id: a.trace.attempt_span(key.1),
            parent: a.trace.parent_id,
            times: (a.start, now),
            attributes,
            status,
        };
        self.emit(&a.trace, span);
        let mut steps = lock(&self.inner.steps);
        let left: Vec<_> = steps
            .keys()
            .filter(|(run, fence, _)| (*run, *fence) == key)
            .copied()
            .collect();
        for k in left {
            let (start, name) = steps.remove(&k).expect("listed above");
            self.step_span(
                &a.trace,
                k,
                name,
                (start, now),
                Status::error("not recorded"),
            );
        }
    }

    fn step_span(
        &self,
        trace: &RunTrace,
        (run, fence, step): (RunId, Fence, u32),
        name: String,
        times: (SystemTime, SystemTime),
        status: Status,
    ) {
        let span = Span {
            name: format!("step {name}"),
            kind: SpanKind::Internal,
            id: trace.step_span(fence, step),
            parent: Some(trace.attempt_span(fence)),
            times,
            attributes: vec![
                KeyValue::new("pelican.run", run_attr(run)),
                KeyValue::new("pelican.step", i64::from(step)),
                KeyValue::new("pelican.step_name", name),
            ],
            status,
        };
        self.emit(trace, span);
    }
}

/// A span to export.
struct Span {
    name: String,
    kind: SpanKind,
    id: u64,
    parent: Option<u64>,
    times: (SystemTime, SystemTime),
    attributes: Vec<KeyValue>,
    status: Status,
}

impl Probe for Otel {
    fn keeps_roles(&self) -> bool {
        false
    }

    fn executing(&self, role: &RoleId, execution: &Execution, own_fence: Option<Fence>) {
        let _ = own_fence;
        let RoleId::Delivery(worker, entry, _) = *role else {
            return;
        };
        let key = (execution.run, execution.fence);
        let attempt = Attempt {
            trace: RunTrace::of(execution.run, execution.trace.as_deref()),
            kind: execution.kind.clone(),
            attempt: execution.attempt,
            worker,
            start: SystemTime::now(),
            outcome: None,
        };
        lock(&self.inner.attempts).insert(key, attempt);
        lock(&self.inner.deliveries).insert((worker, entry), key);
    }

    fn job_ended(&self, role: &RoleId, outcome: &JobOutcome, took: Duration) {
        let _ = took;
        let RoleId::Delivery(worker, entry, _) = role else {
            return;
        };
        let Some(key) = lock(&self.inner.deliveries)
            .get(&(*worker, *entry))
            .copied()
        else {
            return;
        };
        if let Some(a) = lock(&self.inner.attempts).get_mut(&key) {
            a.outcome = Some(outcome.clone());
        }
    }

    fn delivery_end(&self, worker: WorkerId, entry: EntryId, end: DeliveryEnd) {
        let key = lock(&self.inner.deliveries).remove(&(worker, entry));
        if let Some(key) = key {
            self.attempt_ended(key, end);
        }
    }
}

impl StepHook for Otel {
    fn at(
        &self,
        run: RunId,
        fence: Fence,
        step: u32,
        name: &str,
        at: StepBoundary,
    ) -> BoxFuture<()> {
        let key = (run, fence, step);
        match at {
            StepBoundary::Starting => {
                lock(&self.inner.steps).insert(key, (SystemTime::now(), name.to_owned()));
            }
            StepBoundary::Ran => {}
            StepBoundary::Recorded => {
                let started = lock(&self.inner.steps).remove(&key);
                let trace = lock(&self.inner.attempts)
                    .get(&(run, fence))
                    .map(|a| a.trace);
                if let (Some((start, name)), Some(trace)) = (started, trace) {
                    let times = (start, SystemTime::now());
                    self.step_span(&trace, key, name, times, Status::Ok);
                }
            }
        }
        Box::pin(std::future::ready(()))
    }
}

/// A run id as an attribute (OTLP integers are signed).
fn run_attr(run: RunId) -> i64 {
    i64::try_from(run.0).unwrap_or(i64::MAX)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `endpoint` as the URL spans are posted to.
fn traces_url(endpoint: &str) -> Result<String> {
    let uri: hyper::Uri = endpoint
        .parse()
        .with_context(|| format!("--otlp-endpoint {endpoint:?} is not a URL"))?;
    if uri.scheme().is_none() || uri.host().is_none() {
        anyhow::bail!("--otlp-endpoint {endpoint:?} needs a scheme and a host (http://host:4318)");
    }
    Ok(match uri.path() {
        "" | "/" => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        _ => endpoint.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_bare_endpoint_gets_the_traces_path() {
        assert_eq!(
            super::traces_url("http://h:4318").unwrap(),
            "http://h:4318/v1/traces"
        );
        assert_eq!(
            super::traces_url("http://h:4318/").unwrap(),
            "http://h:4318/v1/traces"
        );
        assert_eq!(
            super::traces_url("http://h/x/traces").unwrap(),
            "http://h/x/traces"
        );
        assert!(super::traces_url("h:4318").is_err());
    }
}
