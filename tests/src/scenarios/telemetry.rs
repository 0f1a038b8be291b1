//! OpenTelemetry: the spans a deployment exports, as a real OTLP/HTTP
//! receiver decodes them.

use super::agent;
use crate::Env;
use crate::otlp::{OtlpSink, SpanSeen};
use pelican_model::ids::RunId;
use serde_json::{Value, json};
use std::time::Duration;

/// With `--otlp-endpoint`, a run submitted with a `traceparent` joins the
/// caller's trace: the API's `submit` span is a child of the caller's
/// span, and its id is the parent the run is stored under; each attempt's
/// span (run, attempt, fence, worker, outcome) is a child of it, and each
/// recorded step's a child of its attempt's. A run submitted without one
/// has a trace of its own, rooted at its `submit` span, holding both of
/// its attempts. Each item of an array joins the caller's trace under a
/// span of its own.
pub fn runs_export_their_spans_to_an_otlp_receiver(mutant: Option<&str>) {
    let sink = OtlpSink::start();
    let otlp = ["--otlp-endpoint", sink.url.as_str()];
    let mut env = Env::mutated(mutant);
    let (_api, base) = env.api_with_flags("tok", 3, &otlp);
    let _w1 = env.worker(1, None, &otlp);
    let _w2 = env.worker(2, None, &otlp);
    let (trace, caller) = (
        0x0af7_6519_16cd_43dd_8448_eb21_1c80_319c_u128,
        0xb7ad_6b71_6920_3331_u64,
    );
    let header = format!("00-{trace:032x}-{caller:016x}-01");
    let post = |body: Value, traceparent: Option<&str>| -> Value {
        let mut request = agent()
            .post(format!("{base}/runs"))
            .header("Authorization", "Bearer tok");
        if let Some(t) = traceparent {
            request = request.header("traceparent", t);
        }
        let mut resp = request.send_json(body).expect("the API answers");
        resp.body_mut().read_json().expect("JSON")
    };
    let id = |v: &Value| RunId(v["run_id"].as_u64().expect("a run id"));
    let steps = id(&post(
        json!({"kind": "steps", "input": {"calls": 2}}),
        Some(&header),
    ));
    let flaky = id(&post(
        json!({"kind": "fail", "input": {"class": "retryable", "times": 1}}),
        None,
    ));
    let bulk = post(json!([{"kind": "noop"}, {"kind": "noop"}]), Some(&header));
    let bulk: Vec<RunId> = (0..2).map(|i| id(&bulk["runs"][i])).collect();
    let runs = [steps, flaky, bulk[0], bulk[1]];
    for run in runs {
        env.accepted.insert(run);
    }
    env.settle();
    env.check(&[]);
    let attempts = |spans: &[SpanSeen], run: RunId| -> Vec<SpanSeen> {
        let run = run.0.to_string();
        let mut a: Vec<SpanSeen> = spans
            .iter()
            .filter(|s| s.name.starts_with("attempt ") && s.attr("pelican.run") == run)
            .cloned()
            .collect();
        a.sort_by_key(|s| s.attr("pelican.attempt").to_owned());
        a
    };
    let spans = sink.wait_for(Duration::from_secs(30), |spans| {
        let steps_done = spans.iter().filter(|s| s.name.starts_with("step ")).count() >= 2;
        steps_done
            && attempts(spans, flaky).len() == 2
            && runs.iter().all(|r| !attempts(spans, *r).is_empty())
            && spans
                .iter()
                .filter(|s| s.name.starts_with("submit "))
                .count()
                >= 4
    });
    let db = env.db();
    let submit_of = |run: RunId| -> SpanSeen {
        let stored = db.runs[&run]
            .trace
            .clone()
            .expect("stored with a traceparent");
        let p = pelican_real::telemetry::TraceParent::parse(&stored).expect("a valid header");
        let s = spans
            .iter()
            .find(|s| s.name.starts_with("submit ") && s.span_id == p.parent_id)
            .unwrap_or_else(|| panic!("the submit span {stored} names: {spans:#?}"))
            .clone();
        assert_eq!(s.trace_id, p.trace_id, "{s:?}");
        assert_eq!(s.process, "api", "{s:?}");
        assert_eq!(s.attr("pelican.run"), run.0.to_string(), "{s:?}");
        s
    };

    // The traced run: caller -> submit -> attempt -> steps.
    let submit = submit_of(steps);
    assert_eq!(
        (submit.trace_id, submit.parent),
        (trace, Some(caller)),
        "{submit:?}"
    );
    let [attempt] = &attempts(&spans, steps)[..] else {
        panic!("one attempt: {spans:#?}");
    };
    assert_eq!(
        (attempt.trace_id, attempt.parent),
        (trace, Some(submit.span_id))
    );
    assert_eq!(attempt.process, "worker");
    assert_eq!(attempt.attr("pelican.attempt"), "1");
    assert_eq!(
        attempt.attr("pelican.fence"),
        db.runs[&steps].active_fence.0.to_string()
    );
    assert_eq!(attempt.attr("pelican.outcome"), "succeeded");
    assert!(
        attempt.attr("pelican.worker").starts_with('w'),
        "{attempt:?}"
    );
    assert!(!attempt.error && attempt.times.0 <= attempt.times.1);
    let mut names: Vec<&str> = spans
        .iter()
        .filter(|s| s.parent == Some(attempt.span_id))
        .map(|s| s.name.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["step call-0", "step call-1"], "{spans:#?}");

    // The untraced run: a trace of its own, both attempts under its submit.
    let submit = submit_of(flaky);
    assert_eq!(submit.parent, None, "a root: {submit:?}");
    assert_ne!(submit.trace_id, trace);
    let tries = attempts(&spans, flaky);
    for a in &tries {
        assert_eq!(
            (a.trace_id, a.parent),
            (submit.trace_id, Some(submit.span_id)),
            "{a:?}"
        );
    }
    assert_eq!(tries[0].attr("pelican.outcome"), "failed");
    assert_eq!(tries[0].attr("pelican.error_class"), "retryable");
    assert!(tries[0].error);
    assert_eq!(tries[1].attr("pelican.outcome"), "succeeded");

    // The array's items: the caller's trace, a submit span each.
    let items: Vec<SpanSeen> = bulk.iter().map(|r| submit_of(*r)).collect();
    assert_ne!(items[0].span_id, items[1].span_id);
    for (s, run) in items.iter().zip(&bulk) {
        assert_eq!((s.trace_id, s.parent), (trace, Some(caller)), "{s:?}");
        let [a] = &attempts(&spans, *run)[..] else {
            panic!("one attempt of {run:?}: {spans:#?}");
        };
        assert_eq!(a.parent, Some(s.span_id), "{a:?}");
    }
}
