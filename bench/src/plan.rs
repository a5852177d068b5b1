//! Everything prepared before the measured window: keys, registration,
//! sessions, and every signed `message.send` request as ready-to-write bytes.

use super::http::{rpc_request, Conn};
use crate::setup::Target;
use relay_schemas::client::{key_box, Account, Device};
use serde_json::json;

pub struct BenchAccount {
    pub account: Account,
    pub devices: Vec<Device>,
    /// Session tokens, one per device.
    pub tokens: Vec<String>,
    /// Index into the targets: the account's home relay.
    pub home: usize,
}

/// One pre-built send: the relay to write it to and the request bytes.
pub struct Send {
    pub relay: usize,
    pub request: Vec<u8>,
    pub cross: bool,
    /// The recipient: an index into the accounts.
    pub to: usize,
    /// The envelope's `message_id` (correlates `--ws` notifications).
    pub message_id: String,
}

pub fn now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// When the bench's routes and certificates say they were issued: a little
/// before now, for relays whose clocks lag this one's, and well within the
/// smallest `limits.clock_tolerance` a soak uses (30 s: a 60 s backdating
/// had every registration refused there).
pub fn issued_at() -> u64 {
    now().saturating_sub(10)
}

/// Seeds unique to this run, so `--relays` targets get fresh accounts.
fn seed(run: u64, kind: u8, i: usize, d: usize) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&run.to_le_bytes());
    h.update(&[kind]);
    h.update(&(i as u64).to_le_bytes());
    h.update(&(d as u64).to_le_bytes());
    *h.finalize().as_bytes()
}

fn open_session(c: &mut Conn, target: &Target, account: &Account, device: &Device) -> Result<String, String> {
    let ch = c.ok("session.challenge", None, &json!({"account_id": account.id, "device_id": device.id}))?;
    let challenge = ch["challenge"].as_str().ok_or("session.challenge: no challenge")?;
    let sig = device.session_proof(&account.id, challenge, &target.id);
    let s = c.ok(
        "session.open",
        None,
        &json!({"account_id": account.id, "device_id": device.id, "challenge": challenge, "signature": sig}),
    )?;
    Ok(s["token"].as_str().ok_or("session.open: no token")?.to_string())
}

/// Registers `n` accounts of `devices` devices each, round-robin over the
/// targets, and opens a session for every device.
pub fn register(targets: &[Target], n: usize, devices: usize, run: u64) -> Result<Vec<BenchAccount>, String> {
    let mut conns = targets.iter().map(|t| Conn::open(&t.addr)).collect::<Result<Vec<_>, _>>()?;
    let issued = issued_at();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let home = i % targets.len();
        let t = &targets[home];
        let c = &mut conns[home];
        let account = Account::from_seed(seed(run, 0, i, 0));
        let devs: Vec<Device> =
            (0..devices).map(|d| Device::from_seed(&format!("device-{d}"), seed(run, 1, i, d))).collect();
        let route = account.route(1, &[(t.id.as_str(), t.url.as_str())], issued);
        let cert = account.certificate(&devs[0], issued, None);
        c.ok("account.register", None, &account.register_params(&route, &cert, &t.id, true, issued))?;
        let first = open_session(c, t, &account, &devs[0])?;
        for d in &devs[1..] {
            let cert = account.certificate(d, issued, None);
            c.ok("device.add", Some(&first), &json!({"device_certificate": cert}))?;
        }
        let mut tokens = vec![first];
        for d in &devs[1..] {
            tokens.push(open_session(c, t, &account, d)?);
        }
        out.push(BenchAccount { account, devices: devs, tokens, home });
    }
    Ok(out)
}

/// The recipient of message `m` from account `from`: another account on the
/// same relay, or (for the `cross_share` fraction) one on another relay.
fn recipient(accounts: &[BenchAccount], relays: usize, from: usize, m: usize, cross: bool) -> usize {
    let n = accounts.len();
    let home = accounts[from].home;
    // Accounts are round-robin over relays: account i is on relay i % relays.
    let want = if cross { (home + 1) % relays } else { home };
    let on_relay: Vec<usize> = (0..n).filter(|&i| i % relays == want && i != from).collect();
    if on_relay.is_empty() {
        return from; // a lone account sends to itself
    }
    on_relay[(m / n) % on_relay.len()]
}

/// Builds `count` signed `message.send` requests.
pub fn sends(
    accounts: &[BenchAccount],
    relays: usize,
    count: usize,
    payload: usize,
    cross_share: f64,
    run: u64,
) -> Vec<Send> {
    let created = now();
    let ciphertext = vec![7u8; payload];
    let cross_share = if relays > 1 { cross_share.clamp(0.0, 1.0) } else { 0.0 };
    (0..count)
        .map(|m| {
            let from = m % accounts.len();
            // Spreads cross sends evenly: message m is cross when the running
            // count floor((m+1)·share) steps.
            let cross = ((m + 1) as f64 * cross_share).floor() > (m as f64 * cross_share).floor();
            let to = recipient(accounts, relays, from, m, cross);
            build(accounts, from, to, m, created, &ciphertext, run)
        })
        .collect()
}

/// Builds `count` signed `message.send` requests, all from account `from`
/// to account `to` (`--pending`).
pub fn sends_between(
    accounts: &[BenchAccount],
    from: usize,
    to: usize,
    count: usize,
    payload: usize,
    run: u64,
) -> Vec<Send> {
    let created = now();
    let ciphertext = vec![7u8; payload];
    (0..count).map(|m| build(accounts, from, to, m, created, &ciphertext, run)).collect()
}

/// Message `m` from account `from` to account `to`: boxes for every device
/// of the recipient and of the sender.
fn build(
    accounts: &[BenchAccount],
    from: usize,
    to: usize,
    m: usize,
    created: u64,
    ciphertext: &[u8],
    run: u64,
) -> Send {
    let (a, b) = (&accounts[from], &accounts[to]);
    let devices: Vec<&str> = b.devices.iter().map(|d| d.id.as_str()).collect();
    let (message_id, request) = send_request(a, &b.account.id, &devices, m, created, ciphertext, run);
    Send { relay: a.home, request, cross: a.home != b.home, to, message_id }
}

/// The `message.send` request of message `m` from `a` to account `to_id`,
/// signed: a box for each of `to_devices` and for each of the sender's
/// devices. Returns the message id and the request bytes.
pub fn send_request(
    a: &BenchAccount,
    to_id: &str,
    to_devices: &[&str],
    m: usize,
    created: u64,
    ciphertext: &[u8],
    run: u64,
) -> (String, Vec<u8>) {
    let message_id = format!("bench-{run:x}-{m:010}");
    let env = a.devices[0].envelope(&a.account.id, to_id, &message_id, created, ciphertext);
    let rb: Vec<_> = to_devices.iter().map(|d| key_box(d, &[9u8; 64])).collect();
    let sb: Vec<_> = a.devices.iter().map(|d| key_box(&d.id, &[8u8; 64])).collect();
    let body =
        serde_json::to_vec(&json!({"envelope": env, "recipient_boxes": rb, "sender_boxes": sb})).expect("serializable");
    (message_id, rpc_request("message.send", Some(&a.tokens[0]), &body))
}
