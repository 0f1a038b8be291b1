//! Trace context: the W3C `traceparent` a run is submitted under, and the
//! ids of the spans its attempts and steps make.
//!
//! Every span id is a function of the run's trace, its run id, the
//! attempt's fence and the step's number, not of a random draw or a
//! clock. So the worker that runs an attempt, the job's own code (which
//! hands [`RunTrace::attempt_parent`] to the services it calls) and the
//! exporter (`live::otel`) agree on it without telling one another, and
//! the simulator sees the same ids in every replay of a seed.
//!
//! A run submitted with a `traceparent` belongs to that trace, its
//! attempts children of the span the header names. A run without one gets
//! a trace of its own, its id made from the run id, and its attempts are
//! the trace's roots.

use pelican_model::ids::{Fence, RunId};

/// The HTTP header that carries a trace context (W3C Trace Context).
pub const TRACEPARENT: &str = "traceparent";

/// A parsed `traceparent`: `00-<trace id>-<parent span id>-<flags>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceParent {
    /// The trace (never zero).
    pub trace_id: u128,
    /// The span the caller made the request in (never zero).
    pub parent_id: u64,
    /// Whether the caller records this trace (`sampled`).
    pub sampled: bool,
}

impl TraceParent {
    /// `header`, if it is a `traceparent` of version `00`, or of a later
    /// version read as `00` (as the W3C text says a receiver does); `None`
    /// for anything else, which the receiver then ignores.
    #[must_use]
    pub fn parse(header: &str) -> Option<TraceParent> {
        let b = header.as_bytes();
        let later = b.len() > 55 && b[55] == b'-';
        if !(b.len() == 55 || later) || b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let version = hex(&header[0..2])?;
        if version == 0xff || (version == 0 && b.len() != 55) {
            return None;
        }
        let trace_id = hex(&header[3..35])?;
        let parent_id = u64::try_from(hex(&header[36..52])?).ok()?;
        let flags = hex(&header[53..55])?;
        (trace_id != 0 && parent_id != 0).then_some(TraceParent {
            trace_id,
            parent_id,
            sampled: flags & 1 == 1,
        })
    }

    /// The header's text, version `00`.
    #[must_use]
    pub fn header(&self) -> String {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id,
            self.parent_id,
            u8::from(self.sampled)
        )
    }
}

/// Lowercase hexadecimal digits (the header allows no other), as a number.
fn hex(digits: &str) -> Option<u128> {
    digits
        .bytes()
        .all(|d| d.is_ascii_digit() || (b'a'..=b'f').contains(&d))
        .then(|| u128::from_str_radix(digits, 16).ok())
        .flatten()
}

/// One run's place in a trace: which trace, and the span its attempts
/// are children of (none: they are the roots).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RunTrace {
    /// The run.
    pub run: RunId,
    /// Its trace.
    pub trace_id: u128,
    /// The caller's span, if the run was submitted under one.
    pub parent_id: Option<u64>,
    /// Whether the trace is recorded.
    pub sampled: bool,
}

impl RunTrace {
    /// `run`'s trace, from the `traceparent` it was stored with (a value
    /// that does not parse counts as none).
    #[must_use]
    pub fn of(run: RunId, stored: Option<&str>) -> RunTrace {
        match stored.and_then(TraceParent::parse) {
            Some(p) => RunTrace {
                run,
                trace_id: p.trace_id,
                parent_id: Some(p.parent_id),
                sampled: p.sampled,
            },
            None => RunTrace {
                run,
                trace_id: u128::from(mix(run.0, 1)) << 64 | u128::from(mix(run.0, 2)),
                parent_id: None,
                sampled: true,
            },
        }
    }

    /// The span of the attempt under `fence`.
    #[must_use]
    pub fn attempt_span(&self, fence: Fence) -> u64 {
        self.span(fence.0, 0)
    }

    /// The span of step `step` (0, 1, ...) of the attempt under `fence`.
    #[must_use]
    pub fn step_span(&self, fence: Fence, step: u32) -> u64 {
        self.span(fence.0, u64::from(step) + 1)
    }

    /// The `traceparent` to send from inside the attempt under `fence`: a
    /// service called with it makes its spans children of the attempt's.
    #[must_use]
    pub fn attempt_parent(&self, fence: Fence) -> String {
        TraceParent {
            trace_id: self.trace_id,
            parent_id: self.attempt_span(fence),
            sampled: self.sampled,
        }
        .header()
    }

    /// A span id of this run's, never zero: the trace, run, fence and step
    /// mixed (distinct runs of one trace, as a bulk submission under one
    /// caller's span makes, get distinct ids).
    fn span(&self, fence: u64, step: u64) -> u64 {
        let trace = (self.trace_id >> 64) as u64 ^ self.trace_id as u64;
        let id = mix(mix(mix(trace, self.run.0), fence), step);
        id.max(1)
    }
}

/// SplitMix64's finalizer over `a` and `b`: a well-spread 64-bit value.
fn mix(a: u64, b: u64) -> u64 {
    let mut z = a ^ b
        .wrapping_add(0x9e37_79b9_7f4a_7c15)
        .wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIVEN: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_reads_back_as_written() {
        let p = TraceParent::parse(GIVEN).expect("the W3C text's own example");
        assert_eq!(p.trace_id, 0x4bf9_2f35_77b3_4da6_a3ce_929d_0e0e_4736);
        assert_eq!(p.parent_id, 0x00f0_67aa_0ba9_02b7);
        assert!(p.sampled);
        assert_eq!(p.header(), GIVEN);
    }

    #[test]
    fn malformed_headers_are_ignored() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        let later = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-comes";
        assert!(TraceParent::parse(later).is_some_and(|p| !p.sampled));
    }

    #[test]
    fn a_run_joins_its_callers_trace_or_has_its_own() {
        let joined = RunTrace::of(RunId(7), Some(GIVEN));
        assert_eq!(joined.parent_id, Some(0x00f0_67aa_0ba9_02b7));
        assert_eq!(&joined.attempt_parent(Fence(1))[3..35], &GIVEN[3..35]);
        let own = RunTrace::of(RunId(7), None);
        assert_eq!(own, RunTrace::of(RunId(7), Some("garbage")));
        assert_ne!(own.trace_id, RunTrace::of(RunId(8), None).trace_id);
        assert_eq!(own.parent_id, None);
    }

    #[test]
    fn spans_are_distinct_across_attempts_steps_and_runs() {
        let mut seen = std::collections::BTreeSet::new();
        for run in 1..50 {
            let t = RunTrace::of(RunId(run), Some(GIVEN));
            for fence in 1..5 {
                assert!(seen.insert(t.attempt_span(Fence(fence))));
                for step in 0..5 {
                    assert!(seen.insert(t.step_span(Fence(fence), step)));
                }
            }
        }
    }
}
