//! Random walks through the model, reporting how large the state's counters
//! get: a quick way to spot an unbounded state space.
use pelican_checker::Config;
use pelican_checker::state::{Action, State};

fn main() {
    let name = std::env::args().nth(1).unwrap_or_else(|| "small".into());
    let cfg = Config::named(&name).expect("a configuration");
    let mut rnd = pelican_checker::walk_picker(42);
    let (mut max_seq, mut max_dispatch, mut max_len, mut longest) = (0, 0, 0, 0);
    let mut worst: Vec<Action> = Vec::new();
    for _ in 0..20_000 {
        let mut s = State::initial(&cfg);
        let mut path = Vec::new();
        for _ in 0..400 {
            let mut acts = Vec::new();
            s.actions(&cfg, &mut acts);
            if acts.is_empty() {
                break;
            }
            let a = acts[rnd(acts.len())];
            path.push(a);
            s.step(&cfg, a);
        }
        let seq = s
            .world
            .redis
            .jobs
            .iter()
            .map(|j| j.last_id.seq)
            .max()
            .unwrap_or(0);
        let d = s
            .world
            .db
            .runs
            .values()
            .map(|r| r.dispatch.0)
            .max()
            .unwrap_or(0);
        max_seq = max_seq.max(seq);
        max_dispatch = max_dispatch.max(d);
        max_len = max_len.max(s.world.entries.len());
        if path.len() > longest {
            longest = path.len();
            worst = path;
        }
    }
    println!("max seq {max_seq} dispatch {max_dispatch} entries {max_len} longest path {longest}");
    println!("{:?}", &worst[worst.len().saturating_sub(60)..]);
}
