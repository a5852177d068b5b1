//! Measures what one account can make a relay hold (issue 38, item 1):
//! registers an account, fills it with the largest device certificates the
//! relay still accepts (padded with a signed unknown member) up to the
//! device cap, then opens connections that each send `account.devices.get`
//! pipelined many times without reading the answers, holds them, and
//! closes them. With `--pid` it prints the relay's resident memory
//! (`VmRSS`, Linux) before, during and after.
//!
//! ```text
//! target/debug/relay serve --config /tmp/flood/relay-a.toml &
//! cargo run --example device_flood -- http://127.0.0.1:7801 relay-a --pid $!
//! ```
//!
//! Options: `--connections N` (16), `--requests N` per connection (200),
//! `--hold SECS` (10), `--max-devices N` (stop adding there if the relay
//! has no cap; 40), `--seed N` (a fresh account per seed).

use relay_schemas::client::{Account, Device};
use relay_schemas::objects::{DeviceCertificate, Wire};
use relay_schemas::sign::Tag;
use serde_json::{json, Value};
use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

struct Rpc {
    http: awc::Client,
    base: String,
}

impl Rpc {
    /// The result, or the error object the relay answered.
    async fn call(&self, method: &str, token: Option<&str>, params: &Value) -> Result<Result<Value, Value>, String> {
        let mut req = self.http.post(format!("{}/v1/rpc/{method}", self.base));
        if let Some(t) = token {
            req = req.insert_header(("Authorization", format!("Bearer {t}")));
        }
        let mut resp = req.send_json(params).await.map_err(|e| format!("{method}: {e}"))?;
        let body: Value = resp.json().limit(256 << 20).await.map_err(|e| format!("{method}: {e}"))?;
        Ok(if resp.status().is_success() { Ok(body) } else { Err(body["error"].clone()) })
    }

    async fn ok(&self, method: &str, token: Option<&str>, params: &Value) -> Result<Value, String> {
        self.call(method, token, params).await?.map_err(|e| format!("{method}: {e}"))
    }

    async fn session(&self, relay_id: &str, account: &Account, device: &Device) -> Result<String, String> {
        let ask = json!({"account_id": account.id, "device_id": device.id});
        let ch = self.ok("session.challenge", None, &ask).await?;
        let challenge = ch["challenge"].as_str().ok_or("no challenge")?;
        let signature = device.session_proof(&account.id, challenge, relay_id);
        let open = json!({"account_id": account.id, "device_id": device.id, "challenge": challenge,
                          "signature": signature});
        let s = self.ok("session.open", None, &open).await?;
        Ok(s["token"].as_str().ok_or("no token")?.to_owned())
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `pid`'s resident memory, as `/proc/PID/status` says it.
fn rss(pid: Option<u32>) -> String {
    let Some(pid) = pid else { return "-".into() };
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(|l| l[6..].trim().to_owned()))
        .unwrap_or_else(|| "?".into())
}

/// Device `i`'s certificate grown to exactly `bytes` of canonical JSON with
/// a signed unknown member.
fn padded_certificate(account: &Account, device: &Device, bytes: usize) -> Value {
    let cert = account.certificate(device, now(), None);
    let empty = account.with_member(Tag::DeviceCertificate, &cert, "x-pad", json!(""));
    let base = Wire::<DeviceCertificate>::from_value(&empty).ok().and_then(|w| w.jcs().ok().map(<[u8]>::len));
    let base = base.unwrap_or(0);
    account.with_member(Tag::DeviceCertificate, &cert, "x-pad", json!("a".repeat(bytes.saturating_sub(base))))
}

fn device(i: usize, seed: u8) -> Device {
    let mut key = [seed; 32];
    key[..8].copy_from_slice(&(i as u64).to_le_bytes());
    Device::from_seed(&format!("flood-{i}"), key)
}

struct Args {
    base: String,
    relay_id: String,
    pid: Option<u32>,
    connections: usize,
    requests: usize,
    hold: u64,
    max_devices: usize,
    seed: u8,
}

fn args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        base: "http://127.0.0.1:7801".into(),
        relay_id: "relay-a".into(),
        pid: None,
        connections: 16,
        requests: 200,
        hold: 10,
        max_devices: 40,
        seed: 77,
    };
    let mut positional = 0;
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{v}: {e}"));
        match arg.as_str() {
            "--pid" => a.pid = Some(number(value("--pid")?)? as u32),
            "--connections" => a.connections = number(value("--connections")?)? as usize,
            "--requests" => a.requests = number(value("--requests")?)? as usize,
            "--hold" => a.hold = number(value("--hold")?)?,
            "--max-devices" => a.max_devices = number(value("--max-devices")?)? as usize,
            "--seed" => a.seed = number(value("--seed")?)? as u8,
            _ if positional == 0 => (a.base, positional) = (arg, 1),
            _ if positional == 1 => (a.relay_id, positional) = (arg, 2),
            _ => return Err(format!("unexpected argument {arg}")),
        }
    }
    Ok(a)
}

#[actix_rt::main]
async fn main() -> Result<(), String> {
    let a = args()?;
    let rpc = Rpc { http: awc::Client::builder().timeout(Duration::from_secs(120)).finish(), base: a.base.clone() };
    println!("relay RSS before: {}", rss(a.pid));

    let account = Account::from_seed([a.seed; 32]);
    let first = device(0, a.seed);
    let route = account.route(1, &[(a.relay_id.as_str(), a.base.as_str())], now());
    let params = account.register_params(&route, &account.certificate(&first, now(), None), &a.relay_id, false, now());
    rpc.ok("account.register", None, &params).await?;
    let mut devices = vec![first];
    let mut tokens = vec![rpc.session(&a.relay_id, &account, &devices[0]).await?];

    // The largest certificate the relay takes: the issue's ~900 KiB where
    // nothing bounds it, else exactly limits.max_object_bytes (16 KiB).
    let mut size = 900 << 10;
    let mut stopped = "--max-devices".to_owned();
    while devices.len() < a.max_devices {
        let d = device(devices.len(), a.seed);
        let add = json!({"device_certificate": padded_certificate(&account, &d, size)});
        match rpc.call("device.add", Some(&tokens[0]), &add).await? {
            Ok(_) => devices.push(d),
            Err(e) if e["data"]["limit"] == "limits.max_object_bytes" && size > 16 << 10 => size = 16 << 10,
            Err(e) => {
                stopped = format!("{}: {}", e["code"], e["data"]);
                break;
            }
        }
    }
    println!("account {}: {} certificates of {size} bytes (stopped by {stopped})", account.id, devices.len());
    // One session per connection (each device's own request budget).
    while tokens.len() < a.connections.min(devices.len()) {
        tokens.push(rpc.session(&a.relay_id, &account, &devices[tokens.len()]).await?);
    }
    let ask = json!({"account_id": account.id});
    let answer = rpc.ok("account.devices.get", Some(&tokens[0]), &ask).await?;
    let body = ask.to_string();
    println!(
        "account.devices.get: {} bytes of request, {} bytes of answer",
        body.len(),
        serde_json::to_vec(&answer).map_or(0, |v| v.len())
    );
    println!("relay RSS after filling: {}", rss(a.pid));

    // The flood: each connection writes its requests back to back and
    // never reads; a write that blocks past a second ends that sender.
    let host = a.base.trim_start_matches("http://").trim_end_matches('/').to_owned();
    let started = Instant::now();
    let senders: Vec<_> = (0..a.connections)
        .map(|i| {
            let (host, token, body, requests) =
                (host.clone(), tokens[i % tokens.len()].clone(), body.clone(), a.requests);
            std::thread::spawn(move || -> Result<(TcpStream, usize), String> {
                let mut s = TcpStream::connect(&host).map_err(|e| format!("connect {host}: {e}"))?;
                s.set_write_timeout(Some(Duration::from_secs(1))).map_err(|e| e.to_string())?;
                let request = format!(
                    "POST /v1/rpc/account.devices.get HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {token}\r\n\
                     Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
                let mut sent = 0;
                while sent < requests && s.write_all(request.as_bytes()).is_ok() {
                    sent += 1;
                }
                Ok((s, sent))
            })
        })
        .collect();
    let mut open = Vec::new();
    for sender in senders {
        let (s, sent) = sender.join().map_err(|_| "a sender panicked".to_owned())??;
        open.push((s, sent));
    }
    let sent: usize = open.iter().map(|(_, n)| n).sum();
    println!("{} connections, {sent} requests written in {:?}", open.len(), started.elapsed());
    let mut peak = String::new();
    for second in 1..=a.hold {
        std::thread::sleep(Duration::from_secs(1));
        let now = rss(a.pid);
        println!("  held {second:>2} s: relay RSS {now}");
        peak = now;
    }
    drop(open);
    for second in [1, 5] {
        std::thread::sleep(Duration::from_secs(if second == 1 { 1 } else { 4 }));
        println!("relay RSS {second} s after closing: {}", rss(a.pid));
    }
    println!("relay RSS at the end of the hold: {peak}");
    Ok(())
}
