//! `--population N`: sends to a random account among N registered ones
//! (the target: 1,000,000 accounts with passivation under 2 GiB of relay
//! RSS, sends to a random account still ≥ 10,000/s).
//!
//! Before relay-a starts, [`seed`] registers the N accounts offline, in the
//! bench process: it opens the store of relay-a's data dir exactly as
//! `relay serve` does (from relay-a's config file), builds a [`Supervisor`]
//! with relay-a's policy (a short `passivate_after`, so the seeded actors
//! leave memory) and a transport without peers, and asks every account's
//! actor `AccountCmd::AccountRegister` with the params a client would POST to
//! `account.register`: the real decide/persist path, so the data is what a
//! live registration writes. Keys, signatures and params are built by
//! worker threads and streamed into the registrations, many in flight.
//!
//! Population account `i` is derived from `i` alone ([`account`]): one
//! device `d0`, public discovery on, a route naming relay-a at its URL. The
//! sends' recipients are drawn uniformly from `0..N` by a seeded generator
//! and only their ids are derived again.

use super::plan::{issued_at, now, send_request, BenchAccount, Send};
use crate::setup::progress;
use futures_util::stream::{FuturesUnordered, StreamExt};
use relay::config::Config;
use relay_actors::account::AccountCmd;
use relay_actors::delivery::NoPeers;
use relay_actors::store::Store;
use relay_actors::Supervisor;
use relay_core::clock::{SharedClock, SystemClock};
use relay_schemas::client::{Account, Device};
use relay_schemas::methods::RegisterParams;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The device every population account has.
pub const DEVICE: &str = "d0";

/// relay-a's `actors.passivate_after` with `--population` unless
/// `--passivate-after` says otherwise.
pub const PASSIVATE_AFTER: Duration = Duration::from_secs(5);

/// `actors.passivate_after` while seeding: seeded actors leave memory soon.
const SEED_PASSIVATE_MS: u64 = 500;
/// Registrations in flight at once while seeding.
const IN_FLIGHT: usize = 1024;
/// Arbiters (threads) the seeded actors run on. More than the cores: an
/// actor's commit often waits for sled's log buffers to be written, and
/// with one arbiter per core (2) seeding ran ~25 % slower than with 8.
const SEED_ARBITERS: usize = 8;
/// Indices a seeding worker takes at a time.
const CHUNK: u64 = 256;
/// Longest wait for the seeded actors to passivate (writing their snapshots).
const DRAIN_LIMIT: Duration = Duration::from_secs(120);
/// The seed of the recipients' generator: the same N and message count
/// give the same recipients.
const RECIPIENT_SEED: u64 = 0x5eed_0fa1;

/// The key seed of population account `i` (`kind` 0) or of its device `d0`
/// (`kind` 1): fixed, independent of the run.
fn key_seed(kind: u8, i: u64) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(b"relay-bench/population/v1");
    h.update(&[kind]);
    h.update(&i.to_le_bytes());
    *h.finalize().as_bytes()
}

/// Population account `i`.
pub fn account(i: u64) -> Account {
    Account::from_seed(key_seed(0, i))
}

fn device(i: u64) -> Device {
    Device::from_seed(DEVICE, key_seed(1, i))
}

/// What `relay serve` would do with the `account.register` request of
/// population account `i`, up to the actor: the body a client POSTs,
/// parsed and digested as the RPC layer does.
struct Registration {
    account_id: String,
    params: RegisterParams,
    digest: String,
}

fn registration(i: u64, relay_id: &str, url: &str, issued: u64) -> Result<Registration, String> {
    let account = account(i);
    let route = account.route(1, &[(relay_id, url)], issued);
    let cert = account.certificate(&device(i), issued, None);
    let body = serde_json::to_vec(&account.register_params(&route, &cert, relay_id, true, issued))
        .map_err(|e| e.to_string())?;
    let (params, digest): (RegisterParams, _) = relay::app::parse_with_digest(&body).map_err(|e| e.message)?;
    Ok(Registration { account_id: account.id, params, digest })
}

/// Registers population accounts `0..n` in the store of the relay that
/// `config` describes (not running); returns how long it took. The store is
/// closed (flushed) when this returns.
pub fn seed(config: &Path, n: u64) -> Result<Duration, String> {
    let start = Instant::now();
    let cfg = Config::load(config).map_err(|e| e.to_string())?;
    let store = cfg.open_store()?;
    let mut policy = cfg.policy();
    policy.passivate_after_ms = SEED_PASSIVATE_MS;
    let (relay_id, url) = (cfg.relay.id.clone(), cfg.relay.public_url.clone());
    let issued = issued_at();

    let bar = progress(n, "seeding accounts");
    let workers = std::thread::available_parallelism().map_or(2, |p| p.get());
    let next = AtomicU64::new(0);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Registration, String>>(4 * IN_FLIGHT);
    let result = std::thread::scope(|s| {
        for _ in 0..workers {
            let (tx, next, relay_id, url) = (tx.clone(), &next, &relay_id, &url);
            s.spawn(move || loop {
                let from = next.fetch_add(CHUNK, Ordering::Relaxed);
                if from >= n {
                    return;
                }
                for i in from..(from + CHUNK).min(n) {
                    let r = registration(i, relay_id, url, issued);
                    let failed = r.is_err();
                    // A closed channel: the registrations stopped at an error.
                    if tx.blocking_send(r).is_err() || failed {
                        return;
                    }
                }
            });
        }
        drop(tx);
        register_all(store.clone(), policy, rx, &bar)
    });
    bar.finish_and_clear();
    store.close().map_err(|e| format!("closing the seeded store: {e}"))?;
    drop(store);
    result?;
    Ok(start.elapsed())
}

/// The supervisor's side of [`seed`]: an actix system on this thread,
/// [`SEED_ARBITERS`] arbiters for the account actors, every registration
/// asked and awaited (until durable), then every actor passivated.
fn register_all(
    store: Store,
    policy: relay_core::policy::Policy,
    mut rx: tokio::sync::mpsc::Receiver<Result<Registration, String>>,
    bar: &indicatif::ProgressBar,
) -> Result<(), String> {
    let system = actix::System::new();
    let clock: SharedClock = Arc::new(SystemClock);
    let sup = Supervisor::new(store, policy, clock, Arc::new(NoPeers));
    let arbiters: Vec<actix::Arbiter> = (0..SEED_ARBITERS).map(|_| actix::Arbiter::new()).collect();
    for a in &arbiters {
        sup.add_arbiter(a.handle());
    }
    let registered = system.block_on(async {
        // Its timer actor asks idle actors to leave memory.
        sup.start().map_err(|e| format!("starting the supervisor: {}", e.message))?;
        let mut in_flight = FuturesUnordered::new();
        let mut open = true;
        loop {
            tokio::select! {
                r = rx.recv(), if open && in_flight.len() < IN_FLIGHT => match r {
                    Some(Ok(reg)) => {
                        let sup = sup.clone();
                        in_flight.push(async move {
                            let cmd = AccountCmd::AccountRegister { params: reg.params, digest: reg.digest, known: None };
                            sup.ask(&reg.account_id, cmd)
                                .await
                                .map_err(|e| format!("account.register {}: {}", reg.account_id, e.message))
                        });
                    }
                    Some(Err(e)) => return Err(e),
                    None => open = false,
                },
                Some(r) = in_flight.next(), if !in_flight.is_empty() => {
                    r?;
                    bar.inc(1);
                }
                else => break,
            }
        }
        // Passivating actors write their snapshots, as they would live.
        bar.set_message("seeding: passivating actors");
        let waited = Instant::now();
        while sup.resident_accounts() > 0 {
            if waited.elapsed() > DRAIN_LIMIT {
                return Err(format!("{} seeded actors still resident after {DRAIN_LIMIT:?}", sup.resident_accounts()));
            }
            actix_rt::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    });
    drop(rx);
    for a in arbiters {
        a.stop();
        let _ = a.join();
    }
    drop(sup);
    registered
}

/// A small deterministic generator (splitmix64).
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n`.
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

/// Builds `count` signed `message.send` requests from the bench's own
/// accounts (round-robin) to population accounts drawn uniformly from
/// `0..n`; `Send::to` is the population index. Built on every core.
pub fn sends(accounts: &[BenchAccount], n: u64, count: usize, payload: usize, run: u64) -> Vec<Send> {
    let mut rng = SplitMix(RECIPIENT_SEED);
    let recipients: Vec<u64> = (0..count).map(|_| rng.below(n)).collect();
    let created = now();
    let ciphertext = vec![7u8; payload];
    let workers = std::thread::available_parallelism().map_or(2, |p| p.get());
    let per = count.div_ceil(workers).max(1);
    std::thread::scope(|s| {
        let parts: Vec<_> = recipients
            .chunks(per)
            .enumerate()
            .map(|(part, chunk)| {
                let ciphertext = &ciphertext;
                s.spawn(move || {
                    chunk
                        .iter()
                        .enumerate()
                        .map(|(k, &to)| build(accounts, part * per + k, to, created, ciphertext, run))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        parts.into_iter().flat_map(|h| h.join().expect("building sends")).collect()
    })
}

/// Message `m` to population account `to`: a box for its device `d0`, and
/// boxes for every device of the sender.
fn build(accounts: &[BenchAccount], m: usize, to: u64, created: u64, ciphertext: &[u8], run: u64) -> Send {
    let a = &accounts[m % accounts.len()];
    let (message_id, request) = send_request(a, &account(to).id, &[DEVICE], m, created, ciphertext, run);
    Send { relay: a.home, request, cross: false, to: to as usize, message_id }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn population_accounts_are_fixed_by_their_index() {
        assert_eq!(account(7).id, account(7).id);
        assert_ne!(account(7).id, account(8).id);
        assert_ne!(device(7).key.to_bytes(), device(8).key.to_bytes());
    }

    #[test]
    fn recipients_are_spread_over_the_whole_population() {
        let mut rng = SplitMix(RECIPIENT_SEED);
        let n = 10;
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[rng.below(n) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
    }

    #[test]
    fn a_registration_is_what_account_register_parses() {
        let r = registration(3, "relay-a", "http://127.0.0.1:1", now()).unwrap();
        assert_eq!(r.account_id, account(3).id);
        assert_eq!(r.params.route.account_id, r.account_id);
        assert_eq!(r.digest.len(), 64);
    }
}
