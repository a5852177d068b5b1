//! Memory of account actors: N (default 100,000) accounts registered
//! in-process (a `Supervisor` over a sled store in a temp dir, no peers, the
//! system clock, one actix System), then:
//!
//! 1. **registered, passivated**: RSS once every actor that registered has
//!    passivated (what N registered accounts cost with passivation on);
//! 2. **resident, idle**: a fresh supervisor with passivation off makes every
//!    account resident with one cheap read (`route.get`); the RSS growth
//!    divided by N is the memory of one resident idle actor (the sled cache
//!    and the route book are warmed first so they are not counted);
//! 3. **passivated again**: a supervisor with a short `passivate_after` makes
//!    every account resident, then lets all of them passivate;
//! 4. optionally (`ACTOR_SCALE_SENDS`, default 20,000; 0 skips it) the
//!    in-process throughput of `message.send` between random accounts
//!    (acceptance, local delivery included).
//!
//! ```text
//! cargo bench --bench actor_scale
//! ACTOR_SCALE_N=20000 ACTOR_SCALE_SENDS=0 cargo bench --bench actor_scale
//! ```
//!
//! Each phase runs in its own actix System, so the previous phase's actors
//! are gone; RSS is read from `/proc/self/status` after `malloc_trim`, so it
//! counts memory in use rather than what the allocator kept from the
//! previous phase (both are printed). Register and send params are signed
//! on all cores before anything is measured.

use futures_util::stream::{self, StreamExt};
use relay_actors::account::AccountCmd;
use relay_actors::delivery::NoPeers;
use relay_actors::store::Store;
use relay_actors::Supervisor;
use relay_core::clock::SystemClock;
use relay_core::policy::Policy;
use relay_schemas::client::{key_box, Account, Device};
use relay_schemas::methods::{RegisterParams, SendParams};
use relay_schemas::objects::Status;
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const RELAY: &str = "relay-a";
/// Requests in flight at once (replies wait for a group-committed flush).
const IN_FLIGHT: usize = 512;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn seed(i: usize, salt: u8) -> [u8; 32] {
    let mut s = [salt; 32];
    s[..8].copy_from_slice(&(i as u64).to_le_bytes());
    s
}

fn account(i: usize) -> (Account, Device) {
    (Account::from_seed(seed(i, 0xa1)), Device::from_seed("phone", seed(i, 0xd1)))
}

/// Resident set size in bytes, after handing freed memory back to the OS
/// when `trim` (glibc keeps freed heap otherwise).
fn rss(trim: bool) -> u64 {
    if trim {
        // SAFETY: malloc_trim only releases free heap pages.
        unsafe { libc::malloc_trim(0) };
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    kb * 1024
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// Builds `n` items on every core (signing dominates).
fn par_build<T: Send>(n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let threads = std::thread::available_parallelism().map_or(2, |p| p.get());
    let chunk = n.div_ceil(threads).max(1);
    std::thread::scope(|s| {
        let f = &f;
        let handles: Vec<_> = (0..n)
            .step_by(chunk)
            .map(|lo| s.spawn(move || (lo..(lo + chunk).min(n)).map(f).collect::<Vec<T>>()))
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
    })
}

fn supervisor(store: &Store, passivate_after: Duration) -> Supervisor {
    let mut policy = Policy::with_relay_id(RELAY);
    policy.passivate_after_ms = passivate_after.as_millis() as u64;
    // Every params is signed once, before anything is measured; on a busy
    // machine registering them all can outlast the default tolerance.
    policy.clock_tolerance = 24 * 3600;
    let sup = Supervisor::new(store.clone(), policy, Arc::new(SystemClock), Arc::new(NoPeers));
    sup.start().unwrap();
    sup
}

/// Sends every command, `IN_FLIGHT` at a time; panics on an error reply.
async fn ask_all(sup: &Supervisor, cmds: impl Iterator<Item = (String, AccountCmd)>) {
    stream::iter(cmds)
        .map(|(id, cmd)| {
            let sup = sup.clone();
            async move { sup.ask(&id, cmd).await.unwrap_or_else(|e| panic!("{id}: {e:?}")) }
        })
        .buffer_unordered(IN_FLIGHT)
        .for_each(|_| async {})
        .await;
}

async fn wait_passivated(sup: &Supervisor) -> Duration {
    let start = Instant::now();
    while sup.resident_accounts() > 0 {
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
    start.elapsed()
}

fn read_all(ids: &[String]) -> impl Iterator<Item = (String, AccountCmd)> + '_ {
    ids.iter().map(|id| (id.clone(), AccountCmd::RouteGet))
}

struct Row {
    what: &'static str,
    rss: u64,
    raw: u64,
    note: String,
}

fn main() {
    let n = env_usize("ACTOR_SCALE_N", 100_000);
    let sends = env_usize("ACTOR_SCALE_SENDS", 20_000);
    let t0 = now();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&dir.path().join("store")).unwrap();
    let start_rss = rss(true);

    let started = Instant::now();
    let registers: Vec<(String, RegisterParams)> = par_build(n, |i| {
        let (acct, dev) = account(i);
        let route = acct.route(1, &[(RELAY, "http://127.0.0.1:1")], t0);
        let v = acct.register_params(&route, &acct.certificate(&dev, t0, None), RELAY, true, t0);
        (acct.id.clone(), serde_json::from_str(&v.to_string()).unwrap())
    });
    let ids: Vec<String> = registers.iter().map(|(id, _)| id.clone()).collect();
    eprintln!("built {n} register params in {:.1} s", started.elapsed().as_secs_f64());

    let mut rows = vec![Row { what: "start (store open)", rss: start_rss, raw: start_rss, note: String::new() }];

    // 1. Register everyone; each actor passivates 100 ms after its last command.
    actix_rt::System::new().block_on(async {
        let sup = supervisor(&store, Duration::from_millis(100));
        let started = Instant::now();
        let cmds = registers
            .into_iter()
            .map(|(id, params)| (id, AccountCmd::AccountRegister { params, digest: "bench".into(), known: None }));
        ask_all(&sup, cmds).await;
        let took = started.elapsed();
        let peak = sup.resident_accounts();
        let waited = wait_passivated(&sup).await;
        let raw = rss(false);
        rows.push(Row {
            what: "registered, all passivated",
            rss: rss(true),
            raw,
            note: format!(
                "{n} registered in {:.1} s ({:.0}/s), {peak} resident at the end, all passivated {:.1} s later",
                took.as_secs_f64(),
                n as f64 / took.as_secs_f64(),
                waited.as_secs_f64()
            ),
        });
    });

    // 2. Every account resident and idle (passivation off).
    actix_rt::System::new().block_on(async {
        let sup = supervisor(&store, Duration::from_secs(24 * 3600));
        // Warm what is shared, not per actor: sled's page cache (the
        // snapshots a load reads) and the route book's cache.
        for id in &ids {
            let _ = store.load_snapshot(&relay_actors::account::stream_id(id)).unwrap();
        }
        let sled = rss(true);
        rows.push(Row { what: "warm sled cache", rss: sled, raw: sled, note: String::new() });
        for id in &ids {
            let _ = sup.routes().get(id).unwrap();
        }
        let before = rss(true);
        rows.push(Row {
            what: "warm route book",
            rss: before,
            raw: before,
            note: format!("{:.0} B per cached route", before.saturating_sub(sled) as f64 / n as f64),
        });
        let started = Instant::now();
        ask_all(&sup, read_all(&ids)).await;
        let took = started.elapsed();
        assert_eq!(sup.resident_accounts(), n);
        actix_rt::time::sleep(Duration::from_millis(200)).await;
        let raw = rss(false);
        let after = rss(true);
        let per = after.saturating_sub(before) as f64 / n as f64;
        rows.push(Row {
            what: "all resident, idle",
            rss: after,
            raw,
            note: format!(
                "{per:.0} B per resident actor ({:.2} KiB); {n} loaded in {:.1} s",
                per / 1024.0,
                took.as_secs_f64()
            ),
        });
    });

    // 3. Resident, then all passivated (a short passivate_after).
    actix_rt::System::new().block_on(async {
        let sup = supervisor(&store, Duration::from_millis(500));
        ask_all(&sup, read_all(&ids)).await;
        let waited = wait_passivated(&sup).await;
        let raw = rss(false);
        rows.push(Row {
            what: "loaded again, all passivated",
            rss: rss(true),
            raw,
            note: format!("all passivated {:.1} s after the last load", waited.as_secs_f64()),
        });
    });

    // 4. message.send between random accounts (local delivery).
    let mut throughput = None;
    if sends > 0 && n >= 2 {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let pairs: Vec<(usize, usize)> = (0..sends)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let from = (x % n as u64) as usize;
                let to = (from + 1 + ((x >> 32) % (n as u64 - 1)) as usize) % n;
                (from, to)
            })
            .collect();
        let params: Vec<(String, SendParams)> = par_build(sends, |k| {
            let (from, to) = pairs[k];
            let (acct, dev) = account(from);
            let env = dev.envelope(&acct.id, &ids[to], &format!("bench-{k:016}"), t0, &[7u8; 256]);
            let v = json!({"envelope": env, "recipient_boxes": [key_box("phone", &[9u8; 64])]});
            (acct.id.clone(), serde_json::from_str(&v.to_string()).unwrap())
        });
        throughput = Some(actix_rt::System::new().block_on(async {
            let sup = supervisor(&store, Duration::from_secs(24 * 3600));
            let started = Instant::now();
            let accepted = stream::iter(params.into_iter().enumerate())
                .map(|(k, (id, params))| {
                    let sup = sup.clone();
                    async move {
                        match sup.message_send(&id, "phone".into(), params, format!("{k:064x}")).await {
                            Ok(sent) => match sent.first_attempt {
                                Some(first) => first.await.is_ok_and(|s| s.status == Status::TargetAccepted),
                                None => sent.status.status == Status::TargetAccepted,
                            },
                            other => panic!("{id}: {other:?}"),
                        }
                    }
                })
                .buffer_unordered(IN_FLIGHT)
                .filter(|ok| std::future::ready(*ok))
                .count()
                .await;
            (accepted, started.elapsed())
        }));
    }

    println!();
    println!("actor_scale: {n} accounts, one actix System per phase, RSS after malloc_trim (raw RSS before it)");
    println!("{:<30} {:>12} {:>12}  note", "phase", "RSS", "raw RSS");
    for r in &rows {
        println!("{:<30} {:>12} {:>12}  {}", r.what, mib(r.rss), mib(r.raw), r.note);
    }
    if let Some((accepted, took)) = throughput {
        println!(
            "message.send: {accepted}/{sends} target_accepted (local delivery) in {:.2} s: {:.0} sends/s",
            took.as_secs_f64(),
            sends as f64 / took.as_secs_f64()
        );
    }
    drop(store);
}
