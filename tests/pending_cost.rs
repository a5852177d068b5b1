//! Pending deliveries cost timers, not a polling loop: with 10,000
//! deliveries waiting for a dead destination, the relay is idle between
//! due times.

mod common;

use common::client::{mid, Client, User};
use common::cluster::Cluster;
use serde_json::json;
use std::time::{Duration, Instant};

/// CPU seconds (user + system) the process has used.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

#[actix_rt::test]
async fn ten_thousand_pending_deliveries_leave_the_relay_idle_between_due_times() {
    const N: u64 = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let timetable = "[delivery]\nretry_timetable = [\"0s\", \"1h\"]\n";
    let a = cluster.start("relay-a", timetable);
    let mut b = cluster.start("relay-b", "");
    let ca = Client::new(&a.url);
    let alice = User::register(&ca, "relay-a", 1, false).await;
    let bob = User::register(&Client::new(&b.url), "relay-b", 2, true).await;
    ca.ok("route.get", None, &json!({"account_id": bob.id()})).await;
    b.kill9();

    // Sixteen senders at a time: every send is accepted, its first attempt
    // finds the destination down, and the next is due in an hour.
    let bodies: Vec<_> =
        (0..N).map(|n| serde_json::to_vec(&alice.send_params(&bob, &mid(n), false)).unwrap()).collect();
    let token = alice.tokens[0].clone();
    let mut chunks = bodies.chunks(N as usize / 16).map(|c| c.to_vec()).collect::<Vec<_>>();
    let tasks: Vec<_> = chunks
        .drain(..)
        .map(|chunk| {
            let (c, token) = (ca.clone(), token.clone());
            actix_rt::spawn(async move {
                for body in chunk {
                    let (status, v) = c.raw("message.send", Some(&token), body).await;
                    assert_eq!(status, 200, "{v}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // Let first attempts and their bookkeeping settle, then measure.
    actix_rt::time::sleep(Duration::from_secs(2)).await;
    let window = Duration::from_secs(3);
    let (cpu0, t0) = (cpu_seconds(a.pid()), Instant::now());
    actix_rt::time::sleep(window).await;
    let share = (cpu_seconds(a.pid()) - cpu0) / t0.elapsed().as_secs_f64();
    eprintln!("relay CPU with {N} pending deliveries: {:.2}% of one core", share * 100.0);
    // A polling loop over 10k entries would burn a core; timers cost ~0.
    assert!(share < 0.10, "relay used {:.1}% of a core while idle", share * 100.0);
}
