//! Operations endpoints: health, readiness and Prometheus metrics.

use crate::common;

use common::client::{mid, Client, User};
use common::relay::RelayProc;

/// The value of the first sample line starting with `prefix`.
fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics.lines().find(|l| l.starts_with(prefix)).and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[actix_rt::test]
async fn metrics_count_requests_deliveries_actors_and_flushes() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = User::register(&c, "relay-a", 2, true).await;
    for n in 0..3 {
        c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(n), false)).await;
    }
    c.err("message.delivery.status", None, &serde_json::json!({"message_id": mid(0)})).await;

    let (status, m) = c.get("/metrics").await;
    assert_eq!(status, 200);
    let checks = [
        (r#"relay_requests_total{method="message.send",code="ok"}"#, 3.0),
        (r#"relay_requests_total{method="message.delivery.status",code="unauthorized"}"#, 1.0),
        (r#"relay_deliveries_finished_total{status="target_accepted",error=""}"#, 3.0),
        (r#"relay_delivery_attempts_total{outcome="answered"}"#, 3.0),
        ("relay_account_actors_resident", 2.0),
        ("relay_deliveries_in_flight", 0.0),
    ];
    for (line, want) in checks {
        assert_eq!(sample(&m, line), Some(want), "{line} in\n{m}");
    }
    assert!(sample(&m, "relay_store_flush_batch_commits_count").unwrap() >= 1.0);
    assert!(sample(&m, r#"relay_request_seconds_count{method="message.send"}"#).unwrap() >= 3.0);
}

#[actix_rt::test]
async fn health_and_readiness_answer_while_the_store_works() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    assert_eq!(c.get("/healthz").await, (200, r#"{"status":"ok"}"#.to_string()));
    assert_eq!(c.get("/readyz").await, (200, r#"{"status":"ready"}"#.to_string()));
}

// ---- what an operator sees: peer trouble, deliveries, process ----------

use common::cluster::{free_port, Cluster};
use common::fake_peer::{FakePeer, RouteReply};
use common::wait::eventually;
use std::time::Duration;

/// Bound on every wait for a log line or a metric.
const WAIT: Duration = Duration::from_secs(15);

/// An account id no relay serves.
const NOBODY: &str = "0123456789abcdef0123456789abcdef";

/// Polls `/metrics` (at `c`) until the sample `line` reaches `at_least`.
async fn wait_metric(c: &Client, line: &str, at_least: f64) -> String {
    eventually(&format!("{line} reaches {at_least}"), WAIT, || async {
        let (status, m) = c.get("/metrics").await;
        assert_eq!(status, 200);
        if sample(&m, line).is_some_and(|v| v >= at_least) {
            Ok(m)
        } else {
            Err(m)
        }
    })
    .await
}

/// A relay-to-relay request as a stranger or a misbehaving peer makes it.
async fn relay_request(url: &str, headers: &[(&str, String)], body: &str) -> u16 {
    let mut req = awc::Client::default().post(format!("{url}/v1/relay/route.get")).content_type("application/json");
    for (name, value) in headers {
        req = req.insert_header((*name, value.as_str()));
    }
    req.send_body(body.to_owned()).await.expect("request").status().as_u16()
}

#[actix_rt::test]
async fn a_peer_pair_configured_one_way_warns_on_both_sides_and_counts_unauthorized() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    // relay-b lists relay-a; relay-a lists nobody.
    let listen_a = cluster.url("relay-a").trim_start_matches("http://").to_owned();
    let a = RelayProc::start_at(dir.path(), "relay-a", &listen_a, "");
    let b = cluster.start("relay-b", "");
    let (ca, cb) = (Client::new(&a.url), Client::new(&b.url));

    // relay-b asks its peers for a route it does not know (for a device with
    // a session there: strangers get only what relay-b knows).
    let asker = User::register(&cb, "relay-b", 9, false).await;
    assert_eq!(
        cb.err("route.get", asker.token(0), &serde_json::json!({"account_id": NOBODY})).await,
        "route_not_found"
    );

    let refused = a.wait_for_log(&["WARN", "refused a relay request", "relay-b", "not a configured peer"], WAIT);
    assert!(refused.contains("route.get"), "{refused}");
    b.wait_for_log(&["WARN", "peer refused our relay authentication", "relay-a", "not a configured peer"], WAIT);
    wait_metric(&ca, r#"relay_peer_requests_total{peer="unknown",direction="in",outcome="unauthorized"}"#, 1.0).await;
    wait_metric(&cb, r#"relay_peer_requests_total{peer="relay-a",direction="out",outcome="unauthorized"}"#, 1.0).await;
}

#[actix_rt::test]
async fn every_reason_a_relay_request_is_refused_is_logged_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", "");
    let c = Client::new(&a.url);
    let b_key = ed25519_dalek::SigningKey::from_bytes(&[201; 32]);
    let body = format!(r#"{{"account_id":"{NOBODY}"}}"#);
    let signed = |ts: u64| {
        vec![
            ("Relay-Id", "relay-b".to_owned()),
            ("Relay-Timestamp", ts.to_string()),
            (
                "Relay-Signature",
                relay_schemas::sign::sign_relay_request(&b_key, "route.get", "relay-a", ts, body.as_bytes()),
            ),
        ]
    };
    let now = common::client::now();

    // A correctly signed request is counted as relay-b's.
    assert_eq!(relay_request(&a.url, &signed(now), &body).await, 404);
    // A stranger (unknown Relay-Id), a bad signature, a timestamp an hour
    // off, a malformed timestamp, no headers at all.
    let mut stranger = signed(now);
    stranger[0].1 = "relay-x".into();
    let mut forged = signed(now);
    forged[2].1 = relay_schemas::sign::sign_relay_request(&b_key, "route.get", "relay-a", now, b"other body");
    let mut malformed = signed(now);
    malformed[1].1 = "yesterday".into();
    let cases = [
        (stranger, "relay-x", "not a configured peer"),
        (forged, "relay-b", "bad signature"),
        (signed(now - 3600), "relay-b", "outside clock tolerance"),
        (malformed, "relay-b", "missing or malformed"),
        (vec![], "(none)", "Relay-Id missing"),
    ];
    for (headers, peer, reason) in &cases {
        assert_eq!(relay_request(&a.url, headers, &body).await, 401, "{reason}");
        a.wait_for_log(&["WARN", "refused a relay request", &format!("peer={peer}"), reason], WAIT);
    }
    wait_metric(&c, r#"relay_peer_requests_total{peer="relay-b",direction="in",outcome="route_not_found"}"#, 1.0).await;
    wait_metric(&c, r#"relay_peer_requests_total{peer="relay-b",direction="in",outcome="unauthorized"}"#, 3.0).await;
    wait_metric(&c, r#"relay_peer_requests_total{peer="unknown",direction="in",outcome="unauthorized"}"#, 2.0).await;
    // Nothing a caller sends becomes a label.
    let (_, m) = c.get("/metrics").await;
    assert!(!m.contains("relay-x"), "{m}");
}

#[actix_rt::test]
async fn an_unreachable_peer_is_logged_once_a_minute_and_counted_every_time() {
    let dir = tempfile::tempdir().unwrap();
    // relay-b is planned (its port and key) but never started.
    let cluster = Cluster::plan(dir.path(), &["relay-a", "relay-b"]);
    let a = cluster.start("relay-a", "");
    let c = Client::new(&a.url);
    let asker = User::register(&c, "relay-a", 9, false).await;
    // Three accounts: a lookup that found nothing is remembered per account.
    for n in 1..=3 {
        let id = format!("{n:032x}");
        assert_eq!(c.err("route.get", asker.token(0), &serde_json::json!({"account_id": id})).await, "route_not_found");
    }
    wait_metric(&c, r#"relay_peer_requests_total{peer="relay-b",direction="out",outcome="unreachable"}"#, 3.0).await;
    a.wait_for_log(&["WARN", "peer unreachable", "peer=relay-b", "suppressed=0"], WAIT);
    assert_eq!(a.count_log(&["peer unreachable"]), 1, "{:#?}", a.log_lines());
}

#[actix_rt::test]
async fn a_peer_answering_a_server_error_is_logged_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakePeer::start("relay-f", dir.path(), 77);
    fake.route_reply_after(NOBODY, 0, RouteReply::Error(500, "internal_error".into()));
    let a = RelayProc::start(dir.path(), "relay-a", &fake.peer_toml());
    let c = Client::new(&a.url);
    let asker = User::register(&c, "relay-a", 9, false).await;
    c.err("route.get", asker.token(0), &serde_json::json!({"account_id": NOBODY})).await;
    a.wait_for_log(&["WARN", "peer answered with a server error", "peer=relay-f", "internal_error"], WAIT);
    wait_metric(&c, r#"relay_peer_requests_total{peer="relay-f",direction="out",outcome="internal_error"}"#, 1.0).await;
}

#[actix_rt::test]
async fn start_and_delivery_lines_say_what_an_operator_needs_and_who_writes_to_whom_only_at_debug() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start_logged(dir.path(), "relay-a", "", "info");
    let started = relay.wait_for_log(&["INFO", "relay started"], WAIT);
    let public_key = std::fs::read_to_string(dir.path().join("relay-a/relay.key")).unwrap();
    let public_key = relay_schemas::encoding::b64_encode(
        ed25519_dalek::SigningKey::from_bytes(
            &relay_schemas::encoding::b64_decode_array::<32>("key", public_key.trim()).unwrap(),
        )
        .verifying_key()
        .as_bytes(),
    );
    let listen = relay.url.trim_start_matches("http://");
    for needle in ["relay=relay-a", &format!("listen={listen}"), &format!("public_key={public_key}"), "peers=0"] {
        assert!(started.contains(needle), "{needle} in {started}");
    }
    assert!(started.contains(&dir.path().join("relay-a/store").display().to_string()), "{started}");

    let c = Client::new(&relay.url);
    let (alice, bob, carol) = three_users(&c).await;
    c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;
    wait_metric(&c, r#"relay_deliveries_finished_total{status="target_accepted",error=""}"#, 1.0).await;
    // carol allows no public discovery and alice has no contact grant.
    let failed = c.ok("message.send", alice.token(0), &alice.send_params(&carol, &mid(2), false)).await;
    assert_eq!(failed["status"], "failed", "{failed}");

    // Lines are ordered: mid(1) finished before mid(2) was sent, so a line
    // about it would come before this one.
    let failed = relay.wait_for_log(&["WARN", "delivery failed", &mid(2)], WAIT);
    for needle in ["error=forbidden", "target=relay-a", "attempts=1", "elapsed_s=", "status=failed"] {
        assert!(failed.contains(needle), "{needle} in {failed}");
    }
    let lines = relay.log_lines();
    for account in [alice.id(), bob.id(), carol.id()] {
        assert!(lines.iter().all(|l| !l.contains(account)), "no account at INFO and WARN: {lines:#?}");
    }
    assert!(lines.iter().all(|l| !l.contains("delivery finished")), "{lines:#?}");
    assert!(lines.iter().all(|l| !l.contains('\x1b')), "no colour on a pipe: {lines:#?}");
    assert!(lines.iter().all(|l| !l.contains("TargetAccepted") && !l.contains("Forbidden")), "{lines:#?}");
    // No access log unless asked for.
    assert!(lines.iter().all(|l| !l.contains("relay::access")), "{lines:#?}");

    // At DEBUG a delivery names its accounts.
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start_logged(dir.path(), "relay-a", "", "warn,relay_actors::delivery=debug");
    let c = Client::new(&relay.url);
    let (alice, bob, carol) = three_users(&c).await;
    c.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), false)).await;
    c.ok("message.send", alice.token(0), &alice.send_params(&carol, &mid(2), false)).await;
    let done = relay.wait_for_log(&["DEBUG", "delivery finished", &mid(1)], WAIT);
    for needle in [format!("from={}", alice.id()), format!("to={}", bob.id()), "status=target_accepted".into()] {
        assert!(done.contains(&needle), "{needle} in {done}");
    }
    let failed = relay.wait_for_log(&["DEBUG", "delivery failed", &mid(2)], WAIT);
    assert!(failed.contains(&format!("to={}", carol.id())), "{failed}");
}

/// alice; bob, who allows public discovery; carol, who does not.
async fn three_users(c: &Client) -> (User, User, User) {
    let alice = User::register(c, "relay-a", 1, false).await;
    let bob = User::register(c, "relay-a", 2, true).await;
    let carol = User::register(c, "relay-a", 3, false).await;
    (alice, bob, carol)
}

#[actix_rt::test]
async fn access_log_writes_one_line_per_request_without_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start_logged(dir.path(), "relay-a", "[log]\naccess = true\n", "warn,relay::access=info");
    let c = Client::new(&relay.url);
    assert_eq!(c.get("/healthz?probe=1").await.0, 200);
    let alice = User::register(&c, "relay-a", 1, true).await;
    c.ok("message.timeline.sync", alice.token(0), &serde_json::json!({"after": 0})).await;
    c.get("/no/such/path").await;

    let health = relay.wait_for_log(&["relay::access", "method=GET", "path=/healthz", "status=200"], WAIT);
    assert!(health.contains("ms=") && health.contains("client=127.0.0.1") && !health.contains("probe"), "{health}");
    relay.wait_for_log(&["method=POST", "path=/v1/rpc/message.timeline.sync", "status=200"], WAIT);
    relay.wait_for_log(&["method=GET", "path=/no/such/path", "status=404"], WAIT);
    let lines = relay.log_lines();
    assert_eq!(lines.iter().filter(|l| l.contains("path=/healthz")).count(), 1, "{lines:#?}");
    assert!(lines.iter().all(|l| !l.contains(&alice.tokens[0])), "a token in the log: {lines:#?}");
}

#[actix_rt::test]
async fn metrics_show_websockets_the_process_and_the_build() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, true).await;
    let ws = common::ws::WsClient::connect(&relay.url, alice.token(0)).await;
    let ws2 = common::ws::WsClient::connect(&relay.url, None).await;
    let m = wait_metric(&c, "relay_websocket_connections", 2.0).await;
    assert_eq!(sample(&m, "relay_websocket_connections"), Some(2.0), "{m}");
    ws.close().await;
    ws2.close().await;
    eventually("relay_websocket_connections returns to 0", WAIT, || async {
        match sample(&c.get("/metrics").await.1, "relay_websocket_connections") {
            Some(0.0) => Ok(()),
            n => Err(format!("{n:?}")),
        }
    })
    .await;

    let (_, m) = c.get("/metrics").await;
    assert_eq!(sample(&m, &format!(r#"relay_build_info{{version="{}"}}"#, env!("CARGO_PKG_VERSION"))), Some(1.0));
    let rss = sample(&m, "process_resident_memory_bytes ").unwrap();
    assert!(rss > 1e6 && rss < 4e9, "{rss}");
    assert!(sample(&m, "process_open_fds ").unwrap() >= 3.0, "{m}");
    assert!(sample(&m, "process_max_fds ").unwrap() >= sample(&m, "process_open_fds ").unwrap(), "{m}");
    assert!(sample(&m, "process_cpu_seconds_total ").unwrap() > 0.0, "{m}");
    assert!(sample(&m, "process_virtual_memory_bytes ").unwrap() >= rss, "{m}");
    assert!(m.ends_with("# EOF\n") && m.matches("# EOF").count() == 1, "{m}");
}

#[actix_rt::test]
async fn metrics_can_have_a_listener_of_their_own() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let relay = RelayProc::start(dir.path(), "relay-a", &format!("[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    let public = Client::new(&relay.url);
    let private = Client::new(&format!("http://127.0.0.1:{port}"));
    let (status, body) = public.get("/metrics").await;
    assert_eq!(status, 404, "{body}");
    let (status, m) = private.get("/metrics").await;
    assert_eq!(status, 200);
    assert!(m.contains("relay_build_info") && m.contains("relay_deliveries_in_flight 0"), "{m}");
    // Only /metrics there; the protocol stays on the public listener.
    assert_eq!(private.get("/healthz").await.0, 404);
    assert_eq!(public.get("/healthz").await.0, 200);
}
