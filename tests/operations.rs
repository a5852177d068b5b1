//! Operations endpoints: health, readiness and Prometheus metrics.

mod common;

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
