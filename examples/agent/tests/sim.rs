//! The agent's handlers under Pelican's simulator: workers killed at every
//! step boundary and at random, paused past their lease, cut off; Redis
//! restarted and wiped; requests and replies lost. Every guarantee is
//! checked, and so is the provider: each tool call of a run applied once,
//! and both applied for every run that succeeded.

#[cfg(madsim)]
mod simulated {
    use pelican_example_agent::{Provider, Question, TOOLS, register};
    use pelican_sdk::{
        BoxFuture, External, JobContext, JobError, JobSim, Registry, RunId, StepFailed,
    };
    use std::sync::Arc;

    /// The agent's provider in the simulation: the simulator's external
    /// service, over the simulated network.
    struct Simulated(External);

    impl Provider for Simulated {
        fn complete(&self, run: RunId, prompt: String) -> BoxFuture<Result<String, JobError>> {
            let external = self.0.clone();
            Box::pin(async move {
                external
                    .query(run, "model", &prompt)
                    .await
                    .map_err(|_| JobError::retryable("the model did not answer"))
            })
        }

        fn call_tool(
            &self,
            run: RunId,
            tool: &str,
            key: Option<String>,
            args: String,
        ) -> BoxFuture<Result<String, JobError>> {
            let (external, tool) = (self.0.clone(), tool.to_owned());
            Box::pin(async move {
                external
                    .effect(run, &tool, key, &args)
                    .await
                    .map_err(|_| JobError::retryable(format!("{tool} did not answer")))
            })
        }
    }

    fn question(random: u64, _n: u32) -> (String, String) {
        let q = Question {
            question: format!("what happened on day {}?", random % 365),
        };
        (
            "agent".into(),
            serde_json::to_string(&q).expect("serializes"),
        )
    }

    fn simulation(register: fn(&mut Registry, Arc<dyn Provider>)) -> JobSim {
        JobSim::new(move |registry, external| {
            register(registry, Arc::new(Simulated(external.clone())));
        })
        .submit(question)
        .effects(|_, _| TOOLS.len() as u32)
    }

    #[test]
    fn agent_runs_survive_a_thousand_simulated_seeds() {
        let sweep = simulation(register).check(0..1_000);
        eprintln!("{} seeds: {:?}", sweep.seeds, sweep.counters);
        // The seeds did what they are for: workers died at step boundaries,
        // a tool call that reached the provider before its attempt died was
        // sent again under its key and not applied again, and model calls
        // waited for the model's limits (S12).
        for event in [
            "step_boundary_kills",
            "kills",
            "external_deduplicated",
            "redis_wipes",
            "slot_waits",
        ] {
            assert!(sweep.count(event) > 0, "no seed had {event}: {sweep:?}");
        }
    }

    /// The planted bug: the same agent, with its tool calls sent without their
    /// idempotency keys. An attempt that dies after a tool call and before its
    /// record makes the next attempt call the tool again, and the provider
    /// applies it twice.
    async fn agent_without_keys(
        ctx: JobContext,
        provider: Arc<dyn Provider>,
    ) -> Result<String, StepFailed> {
        let plan: String = ctx
            .step("model", provider.complete(ctx.run, ctx.input.clone()))
            .await?;
        for tool in TOOLS {
            ctx.step(tool, provider.call_tool(ctx.run, tool, None, plan.clone()))
                .await?;
        }
        Ok(plan)
    }

    #[test]
    fn a_tool_call_without_its_key_fails_a_seed() {
        let sim = simulation(|registry, provider| {
            registry.register("agent", move |ctx| {
                agent_without_keys(ctx, provider.clone())
            });
        });
        let failed = (0..200)
            .map(|seed| sim.run_seed(seed, false))
            .find(|o| !o.passed())
            .expect("a seed within 200 catches tool calls sent without their keys");
        let text = format!("{:?}", failed.broken);
        eprintln!("seed {} caught the planted bug: {text}", failed.seed);
        assert!(
            text.contains("external effect") && text.contains("applied 2 times"),
            "seed {} failed, but not for the tool call applied twice: {text}",
            failed.seed
        );
    }
}

#[cfg(not(madsim))]
#[test]
fn simulated_tests_need_cfg_madsim() {
    panic!(
        "run these tests from examples/agent, whose .cargo/config.toml builds with --cfg madsim"
    );
}
