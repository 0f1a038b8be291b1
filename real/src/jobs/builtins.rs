//! The built-in kinds: what makes the binary and the simulator useful on
//! their own (`noop`, `echo`, `sleep`, `fail`, `panic`, `effect`, `steps`,
//! `limited`), each a handler of the [`Registry`](super::Registry).

use super::*;

pub(super) fn succeeded(result: impl Into<String>) -> JobOutcome {
    JobOutcome::Succeeded {
        result: result.into(),
    }
}

pub(super) fn bad_input(kind: &str, e: &serde_json::Error) -> JobOutcome {
    JobOutcome::Failed {
        class: ErrorClass::Terminal,
        message: format!("bad {kind} input: {e}"),
    }
}

pub(super) async fn pause(ms: u64) {
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

pub(super) async fn noop(_: JobContext) -> JobOutcome {
    succeeded("null")
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EchoInput {
    text: String,
}

pub(super) async fn echo(ctx: JobContext) -> JobOutcome {
    match serde_json::from_str::<EchoInput>(&ctx.input) {
        Ok(i) => succeeded(i.text),
        Err(e) => bad_input("echo", &e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SleepInput {
    ms: u64,
}

pub(super) async fn sleep(ctx: JobContext) -> JobOutcome {
    match serde_json::from_str::<SleepInput>(&ctx.input) {
        Ok(i) => {
            pause(i.ms).await;
            succeeded(format!(
                "{{\"slept_ms\":{},\"attempt\":{}}}",
                i.ms, ctx.attempt
            ))
        }
        Err(e) => bad_input("sleep", &e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FailInput {
    class: FailClass,
    times: u32,
    #[serde(default)]
    ms: u64,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum FailClass {
    Retryable,
    Terminal,
    Unknown,
}

pub(super) async fn fail(ctx: JobContext) -> JobOutcome {
    match serde_json::from_str::<FailInput>(&ctx.input) {
        Ok(i) => {
            pause(i.ms).await;
            if ctx.attempt > i.times {
                return succeeded(format!("{{\"failed_times\":{}}}", i.times));
            }
            let class = match i.class {
                FailClass::Retryable => ErrorClass::Retryable,
                FailClass::Terminal => ErrorClass::Terminal,
                FailClass::Unknown => ErrorClass::Unknown,
            };
            JobOutcome::Failed {
                class,
                message: format!("failing on purpose, attempt {} of {}", ctx.attempt, i.times),
            }
        }
        Err(e) => bad_input("fail", &e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PanicInput {
    times: u32,
}

pub(super) async fn panic(ctx: JobContext) -> JobOutcome {
    match serde_json::from_str::<PanicInput>(&ctx.input) {
        Ok(i) if ctx.attempt <= i.times => {
            panic!("{PANIC_ON_PURPOSE}, attempt {}", ctx.attempt)
        }
        Ok(i) => succeeded(format!("{{\"panicked_times\":{}}}", i.times)),
        Err(e) => bad_input("panic", &e),
    }
}

/// The message of the `panic` kind's panics (a panic hook may silence them).
pub const PANIC_ON_PURPOSE: &str = "job panicking on purpose";

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EffectInput {
    calls: u32,
    #[serde(default)]
    ms: u64,
}

pub(super) async fn effect(ctx: JobContext) -> JobOutcome {
    let i = match serde_json::from_str::<EffectInput>(&ctx.input) {
        Ok(i) => i,
        Err(e) => return bad_input("effect", &e),
    };
    let mut applied = 0;
    for call in 0..i.calls {
        match call_tool(&ctx, call, i.ms).await {
            Ok(now) => applied += u32::from(now),
            Err(e) => return e.into(),
        }
        if let Err(e) = report(&ctx, call, i.calls).await {
            return e.into();
        }
    }
    succeeded(format!(
        "{{\"calls\":{},\"applied_now\":{applied}}}",
        i.calls
    ))
}

/// Side effect `call` of the `effect` and `steps` kinds, after `ms`:
/// whether this request applied it; no answer is worth a retry.
pub(super) async fn call_tool(ctx: &JobContext, call: u32, ms: u64) -> Result<bool, JobError> {
    pause(ms).await;
    ctx.apply(call)
        .await
        .map_err(|e| JobError::retryable(format!("side effect {call}: {e}")))
}

/// The progress event of the `effect` and `steps` kinds after side
/// effect `call` of `calls`.
pub(super) async fn report(ctx: &JobContext, call: u32, calls: u32) -> Result<(), JobError> {
    ctx.progress(&Progress {
        done: call + 1,
        of: calls,
    })
    .await
}

#[derive(Serialize)]
pub(super) struct Progress {
    done: u32,
    of: u32,
}

pub(super) async fn steps(ctx: JobContext) -> JobOutcome {
    let i = match serde_json::from_str::<EffectInput>(&ctx.input) {
        Ok(i) => i,
        Err(e) => return bad_input("steps", &e),
    };
    for call in 0..i.calls {
        let name = format!("call-{call}");
        if let Err(e) = ctx.step(&name, call_tool(&ctx, call, i.ms)).await {
            return e.into();
        }
        if let Err(e) = report(&ctx, call, i.calls).await {
            return e.into();
        }
    }
    succeeded(format!("{{\"calls\":{}}}", i.calls))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct LimitedInput {
    provider: String,
    #[serde(default)]
    ms: u64,
}

pub(super) async fn limited(ctx: JobContext) -> JobOutcome {
    let i = match serde_json::from_str::<LimitedInput>(&ctx.input) {
        Ok(i) => i,
        Err(e) => return bad_input("limited", &e),
    };
    let permit = match ctx.limit(&i.provider).await {
        Ok(p) => p,
        Err(e) => return e.into(),
    };
    let started = crate::now().0;
    pause(i.ms).await;
    let ended = crate::now().0;
    permit.release().await;
    succeeded(format!("{{\"started_ms\":{started},\"ended_ms\":{ended}}}"))
}

/// The number of side effects a built-in job of `kind` with `input` makes
/// when it succeeds (for checking S5 at the end of a test).
#[must_use]
pub fn effects_of(kind: &str, input: &str) -> u32 {
    if kind != "effect" && kind != "steps" {
        return 0;
    }
    serde_json::from_str::<EffectInput>(input).map_or(0, |i| i.calls)
}
