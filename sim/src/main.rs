//! `relay-sim`: runs seeds of the simulator, replays one, or searches for
//! the first seed that catches a planted bug. See docs/simulation.md.

use clap::Parser;
use relay_sim::{minimal_trace, run, Coverage, Plant};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(about = "Deterministic simulation of a network of relays")]
struct Cli {
    /// Run (and replay) this one seed, printing its trace on failure.
    #[arg(long)]
    seed: Option<u64>,
    /// Run this many seeds, from --first.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Messages per seed.
    #[arg(long, default_value_t = 1000)]
    messages: usize,
    /// A planted bug: ack-before-barrier, retry-new-id, lower-revision,
    /// replicate-twice, forget-deadline, deliver-after-revocation,
    /// sweep-early, recompute-visibility, forget-chain-head.
    #[arg(long)]
    plant: Option<String>,
    /// With --seed: print the whole trace.
    #[arg(long)]
    trace: bool,
    /// For every planted bug: the first seed (from --first) that catches it.
    #[arg(long)]
    plant_table: bool,
    /// Threads (seeds are independent; each is single-threaded).
    #[arg(long, default_value_t = 2)]
    jobs: u64,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let plant = match cli.plant.as_deref().map(|p| (p, Plant::parse(p))) {
        Some((name, None)) => {
            eprintln!("unknown plant {name}");
            return ExitCode::from(2);
        }
        Some((_, p)) => p,
        None => None,
    };
    if let Some(seed) = cli.seed {
        return replay(seed, cli.messages, plant, cli.trace);
    }
    if cli.plant_table {
        for p in Plant::ALL {
            let started = Instant::now();
            let found =
                (cli.first..cli.first + cli.seeds).find(|s| run(*s, cli.messages, Some(p), false).violation.is_some());
            let secs = started.elapsed().as_secs_f64();
            match found {
                Some(s) => {
                    println!("{:<26} first failing seed {s} ({} seeds, {secs:.1} s)", p.name(), s - cli.first + 1)
                }
                None => println!("{:<26} not caught in {} seeds", p.name(), cli.seeds),
            }
        }
        return ExitCode::SUCCESS;
    }
    many(&cli, plant)
}

fn replay(seed: u64, messages: usize, plant: Option<Plant>, full: bool) -> ExitCode {
    let r = run(seed, messages, plant, true);
    println!(
        "seed {seed}: {} relays, {} messages ({} acknowledged, {} delivered), {} faults, {} events",
        r.relays, r.messages, r.acked, r.delivered, r.faults, r.events
    );
    println!("trace hash {}", r.trace_hash);
    print!("coverage:\n{}", r.coverage);
    if full {
        r.trace.iter().for_each(|l| println!("{l}"));
    }
    match &r.violation {
        None => ExitCode::SUCCESS,
        Some(v) => {
            println!("FAILED seed {seed}: {v}");
            println!("minimal trace (replay: relay-sim --seed {seed} --messages {messages}{}):", plant_arg(plant));
            minimal_trace(&r.trace, v.mid.as_deref()).iter().for_each(|l| println!("  {l}"));
            ExitCode::FAILURE
        }
    }
}

fn many(cli: &Cli, plant: Option<Plant>) -> ExitCode {
    let started = Instant::now();
    let next = AtomicU64::new(cli.first);
    let end = cli.first + cli.seeds;
    let totals = Mutex::new((Coverage::default(), 0u64, 0u64, 0u64, Vec::new()));
    // Each seed's wall time (seed, ms): the band's median and its slowest.
    let times = Mutex::new(Vec::with_capacity(cli.seeds as usize));
    std::thread::scope(|scope| {
        for _ in 0..cli.jobs.max(1) {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    break;
                }
                let one = Instant::now();
                let r = run(seed, cli.messages, plant, false);
                let ms = one.elapsed().as_secs_f64() * 1000.0;
                times.lock().unwrap_or_else(|e| e.into_inner()).push((seed, ms));
                let mut t = totals.lock().unwrap_or_else(|e| e.into_inner());
                t.0.add(&r.coverage);
                t.1 += r.messages as u64;
                t.2 += r.faults;
                t.3 += r.events;
                if let Some(v) = r.violation {
                    t.4.push((seed, v));
                }
            });
        }
    });
    let (coverage, messages, faults, events, mut failed) = totals.into_inner().unwrap_or_else(|e| e.into_inner());
    failed.sort_by_key(|(s, _)| *s);
    println!(
        "{} seeds from {}: {messages} messages, {faults} faults, {events} events, {} failed, {:.1} s wall",
        cli.seeds,
        cli.first,
        failed.len(),
        started.elapsed().as_secs_f64()
    );
    let mut times = times.into_inner().unwrap_or_else(|e| e.into_inner());
    times.sort_by(|a, b| a.1.total_cmp(&b.1));
    if let (Some((_, median)), Some((slowest, max))) = (times.get(times.len() / 2), times.last()) {
        println!("per seed: median {median:.0} ms, max {max:.0} ms (seed {slowest})");
    }
    print!("coverage:\n{coverage}");
    for (seed, v) in failed.iter().take(10) {
        println!(
            "FAILED seed {seed}: {v}  (replay: relay-sim --seed {seed} --messages {}{})",
            cli.messages,
            plant_arg(plant)
        );
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The `--plant` argument that replays a run of `plant`.
fn plant_arg(plant: Option<Plant>) -> String {
    plant.map(|p| format!(" --plant {}", p.name())).unwrap_or_default()
}
