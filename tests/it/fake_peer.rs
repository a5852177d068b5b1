//! Cross-relay delivery from a real source relay ("relay-a") to scripted
//! fake destination relays (`common::fake_peer`), checked against the seed
//! (`001_…`, "Delivery Deadlines and Retries", its "Error Handling and
//! Retries" table and "Delivery Result Confirmation and Destination Relay
//! Switching") and PROTOCOL §3 (relay RPC authentication).
//!
//! The source runs a millisecond timetable; every test scripts the fake's
//! answers per `message_id` and reads back what reached the fake: how many
//! attempts, when, with which bytes and headers, and which route lookups
//! happened between them.

use crate::common;

use common::client::{mid, now, relay_post, Client, User};
use common::cluster::{write_key, Cluster};
use common::fake_peer::{FakePeer, Reply, Request};
use common::relay::RelayProc;
use common::schema::assert_valid;
use common::wait::eventually;
use ed25519_dalek::{SigningKey, VerifyingKey};
use relay_schemas::client::Account;
use relay_schemas::sign::{parse_public_key, relay_request_bytes, sign_relay_request, verify_bytes};
use serde_json::{json, Value};
use std::time::Duration;
use tempfile::TempDir;

/// Attempts at +0, +200, +400, +600 ms from acceptance, then every 200 ms.
const FAST: &str = r#"[delivery]
retry_timetable = ["0s", "200ms", "400ms", "600ms"]
retry_then_every = "200ms"
attempt_timeout = "800ms"
"#;

/// Longer than FAST's attempt_timeout.
const HANG: Duration = Duration::from_millis(2000);

/// The source relay "relay-a" (a real process) and its local sender "alice".
struct Source {
    _relay: RelayProc,
    client: Client,
    alice: User,
    /// relay-a's public key (written before start), to check its signatures.
    key: VerifyingKey,
}

fn tempdir() -> TempDir {
    tempfile::tempdir().unwrap()
}

impl Source {
    /// Starts relay-a peering with `peers`, with `delivery` (a `[delivery]`
    /// section) and `delivery_age_limit = age_limit`, and registers alice.
    async fn start(dir: &TempDir, peers: &[&FakePeer], delivery: &str, age_limit: &str) -> Source {
        let key = write_key(&dir.path().join("relay-a").join("relay.key"), [150; 32]);
        let key = parse_public_key("relay-a", &key).unwrap();
        let mut extra: String = peers.iter().map(|p| p.peer_toml()).collect();
        extra.push_str(delivery);
        extra.push_str(&format!("\n[limits]\ndelivery_age_limit = \"{age_limit}\"\n"));
        let relay = RelayProc::start(dir.path(), "relay-a", &extra);
        let client = Client::new(&relay.url);
        let alice = User::register(&client, "relay-a", 1, false).await;
        Source { _relay: relay, client, alice, key }
    }

    fn params(&self, to: &Account, message_id: &str, created_at: u64) -> Value {
        self.alice.params_to(0, &to.id, message_id, created_at, &["phone"], Some(&["phone"]))
    }

    /// `message.send` of message `n` to `to`, created now: (message_id, status).
    async fn send(&self, to: &Account, n: u64) -> (String, Value) {
        let m = mid(n);
        let st = self.client.ok("message.send", self.alice.token(0), &self.params(to, &m, now())).await;
        assert_valid("DeliveryStatus.schema.json", &st);
        (m, st)
    }

    async fn status(&self, message_id: &str) -> Value {
        let st =
            self.client.ok("message.delivery.status", self.alice.token(0), &json!({"message_id": message_id})).await;
        assert_valid("DeliveryStatus.schema.json", &st);
        st
    }

    /// Polls `message.delivery.status` every 50 ms (at most 10 s) until it is
    /// terminal: (terminal status, the non-terminal statuses seen before).
    async fn wait_terminal(&self, message_id: &str) -> (Value, Vec<Value>) {
        let seen = std::cell::RefCell::new(vec![]);
        let st = eventually(&format!("{message_id} terminal"), Duration::from_secs(10), || async {
            let st = self.status(message_id).await;
            if st["status"] != "delivering" {
                return Ok(st);
            }
            seen.borrow_mut().push(st.clone());
            Err(st.to_string())
        })
        .await;
        (st, seen.into_inner())
    }

    /// Makes "no attempt after the delivery ended" checks that follow it
    /// non-vacuous. A later message `mid(n)` to a fresh recipient at
    /// `peer` is refused twice with a retryable error, so the source's
    /// timer fires twice more (slots 200 ms apart, one timer for the
    /// earliest due entry) before it is accepted: an attempt still due for
    /// an earlier delivery would have reached its peer by then. And then
    /// no delivery is armed at all (`relay_deliveries_in_flight` is 0), so
    /// none can come later either.
    async fn later_retries_ran(&self, peer: &FakePeer, n: u64) {
        let marker = recipient(200);
        peer.set_route(&marker.id, route(&marker, 1, peer));
        let m = mid(n);
        peer.script(
            &m,
            [Reply::error("temporarily_unavailable"), Reply::error("temporarily_unavailable"), Reply::Accept],
        );
        let (m, _) = self.send(&marker, n).await;
        let (fin, _) = self.wait_terminal(&m).await;
        assert_eq!(fin["status"], "target_accepted", "the later message {m}: {fin}");
        assert_eq!(peer.deliveries(&m).len(), 3, "the later message {m}: two refused attempts and the accepted one");
        eventually("no delivery armed", Duration::from_secs(10), || async {
            match self.client.metric("relay_deliveries_in_flight").await {
                Some(0.0) => Ok(()),
                n => Err(format!("relay_deliveries_in_flight {n:?}")),
            }
        })
        .await;
    }

    /// The sent record of `message_id` in alice's timeline.
    async fn sent_record(&self, message_id: &str) -> Value {
        let records = self.alice.sync_all(&self.client, 0).await;
        records
            .into_iter()
            .find(|r| r["direction"] == "sent" && r["envelope"]["message_id"] == message_id)
            .unwrap_or_else(|| panic!("no sent record of {message_id}"))
    }
}

/// A remote recipient account (its home relay is a fake).
fn recipient(seed: u8) -> Account {
    Account::from_seed([seed; 32])
}

/// `to`'s signed route of `revision` naming `relay`.
fn route(to: &Account, revision: u64, relay: &FakePeer) -> Value {
    to.route(revision, &[(relay.id.as_str(), relay.url.as_str())], now())
}

/// Every request's body is byte-identical to the first.
#[track_caller]
fn assert_same_bodies(what: &str, reqs: &[Request]) {
    for (i, r) in reqs.iter().enumerate().skip(1) {
        assert!(
            r.body == reqs[0].body,
            "{what}: attempt {} body differs from attempt 1:\n  1: {}\n  {}: {}",
            i + 1,
            String::from_utf8_lossy(&reqs[0].body),
            i + 1,
            String::from_utf8_lossy(&r.body)
        );
    }
}

/// The request carries relay-a's PROTOCOL §3 authentication for `target`.
#[track_caller]
fn assert_signed_by_source(req: &Request, key: &VerifyingKey, target: &str) {
    assert_eq!(req.header("Relay-Id"), Some("relay-a"), "Relay-Id of {req:?}");
    let ts: u64 = req.header("Relay-Timestamp").expect("Relay-Timestamp").parse().expect("numeric Relay-Timestamp");
    assert!(ts.abs_diff(now()) <= 60, "Relay-Timestamp {ts} is not about now");
    let sig = req.header("Relay-Signature").expect("Relay-Signature");
    verify_bytes(key, &relay_request_bytes(&req.method, target, ts, &req.body), sig)
        .unwrap_or_else(|e| panic!("Relay-Signature of {} for {target} does not verify: {e:?}", req.method));
}

fn error_code(st: &Value) -> &str {
    st["error"]["code"].as_str().unwrap_or("<none>")
}

// ---- Error Handling and Retries: one test per row ---------------------------------

/// Seed row: `internal_error`, `bad_gateway`, `rate_limited`,
/// `temporarily_unavailable` → "Retry, retaining `delivering`".
#[actix_rt::test]
async fn retryable_errors_are_retried_retaining_delivering_until_target_accepted() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    let src = Source::start(&dir, &[&b], FAST, "20s").await;
    let codes = ["internal_error", "bad_gateway", "rate_limited", "temporarily_unavailable"];
    let cases = codes.iter().enumerate().map(|(i, code)| {
        let bob = recipient(40 + i as u8);
        b.set_route(&bob.id, route(&bob, 1, &b));
        let n = i as u64 + 1;
        b.script(&mid(n), [Reply::error(code), Reply::error(code), Reply::Accept]);
        let src = &src;
        async move {
            let (m, sent) = src.send(&bob, n).await;
            assert_eq!(sent["status"], "delivering", "{code}: message.send after a failed first attempt: {sent}");
            let (fin, seen) = src.wait_terminal(&m).await;
            assert_eq!(fin["status"], "target_accepted", "{code}: {fin}");
            assert_eq!(fin["accepted_at"], sent["accepted_at"], "{code}: the source's accepted_at never changes");
            assert!(seen.iter().all(|s| s["error"].is_null()), "{code}: delivering carries no error: {seen:?}");
            (code, m)
        }
    });
    let done = futures_util::future::join_all(cases).await;
    src.later_retries_ran(&b, 100).await;
    for (code, m) in done {
        let d = b.deliveries(&m);
        assert_eq!(d.len(), 3, "{code}: two failed attempts and the accepted one, nothing after");
        assert_same_bodies(code, &d);
        assert!(b.committed(&m));
    }
}

/// Seed row: `route_stale`, `target_not_local`, `route_not_found`,
/// `not_found`, `invalid_state` → "Refresh the route bypassing caches and
/// retry"; with no higher revision there is nothing to switch to, so the
/// retry goes to the same target (relay-c, also a peer, sees nothing).
#[actix_rt::test]
async fn route_errors_refresh_the_route_bypassing_caches_and_retry_the_same_target() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    let c = FakePeer::start("relay-c", dir.path(), 32);
    let src = Source::start(&dir, &[&b, &c], FAST, "20s").await;
    let codes = ["route_stale", "target_not_local", "route_not_found", "not_found", "invalid_state"];
    let cases = codes.iter().enumerate().map(|(i, code)| {
        let bob = recipient(50 + i as u8);
        b.set_route(&bob.id, route(&bob, 1, &b));
        let n = i as u64 + 1;
        b.script(&mid(n), [Reply::error(code), Reply::Accept]);
        let (src, b, c) = (&src, &b, &c);
        async move {
            let (m, sent) = src.send(&bob, n).await;
            assert_eq!(sent["status"], "delivering", "{code}: {sent}");
            let (fin, _) = src.wait_terminal(&m).await;
            assert_eq!(fin["status"], "target_accepted", "{code}: {fin}");
            let d = b.deliveries(&m);
            assert_eq!(d.len(), 2, "{code}: the rejected attempt and one retry at relay-b");
            assert_same_bodies(code, &d);
            let refreshed = b.route_gets(&bob.id).iter().filter(|r| r.seq > d[0].seq && r.seq < d[1].seq).count();
            assert!(refreshed >= 1, "{code}: no route.get reached relay-b between the error and the retry");
            let refreshed_c = c.route_gets(&bob.id).iter().filter(|r| r.at > d[0].at && r.at < d[1].at).count();
            assert!(refreshed_c >= 1, "{code}: the refresh bypassing caches should ask every peer");
            assert!(c.deliveries(&m).is_empty(), "{code}: same revision, so no switch to relay-c");
        }
    });
    futures_util::future::join_all(cases).await;
}

/// Seed rows: `device_unknown` → "End delivery with this error";
/// `clock_skew` → "End delivery with this error; retain the original
/// envelope and sent record without automatically rewriting `created_at`,
/// re-signing, or resending".
#[actix_rt::test]
async fn device_unknown_and_clock_skew_end_delivery_with_that_error_keeping_the_sent_record() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    let src = Source::start(&dir, &[&b], FAST, "20s").await;
    let codes = ["device_unknown", "clock_skew"];
    let mut sent_envelopes = vec![];
    for (i, code) in codes.iter().enumerate() {
        let bob = recipient(60 + i as u8);
        b.set_route(&bob.id, route(&bob, 1, &b));
        let m = mid(i as u64 + 1);
        b.script(&m, [Reply::error(code)]); // then Accept, were it asked again
        let params = src.params(&bob, &m, now());
        let sent = src.client.ok("message.send", src.alice.token(0), &params).await;
        let (fin, _) = src.wait_terminal(&m).await;
        assert_eq!((fin["status"].as_str(), error_code(&fin)), (Some("failed"), *code), "{fin} (send said {sent})");
        sent_envelopes.push((code, m, params["envelope"].clone()));
    }
    src.later_retries_ran(&b, 100).await;
    for (code, m, envelope) in sent_envelopes {
        assert_eq!(b.deliveries(&m).len(), 1, "{code}: no attempt after the delivery ended");
        let st = src.status(&m).await;
        assert_eq!(
            (st["status"].as_str(), error_code(&st)),
            (Some("failed"), *code),
            "{code}: terminal state is stable"
        );
        let record = src.sent_record(&m).await;
        assert_eq!(record["envelope"], envelope, "{code}: the original envelope is retained unchanged");
        assert_eq!(record["delivery"]["status"], "failed", "{code}: {record}");
        assert_eq!(record["delivery"]["error"]["code"], *code, "{code}: {record}");
    }
}

/// Seed row: "Other defined errors" → "End delivery with that error".
#[actix_rt::test]
async fn other_defined_errors_end_delivery_with_that_error() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    let src = Source::start(&dir, &[&b], FAST, "20s").await;
    let codes = [
        "forbidden",
        "invalid_signature",
        "invalid_params",
        "unauthorized",
        "state_conflict",
        "payload_too_large",
        "message_expired",
    ];
    let cases = codes.iter().enumerate().map(|(i, code)| {
        let bob = recipient(70 + i as u8);
        b.set_route(&bob.id, route(&bob, 1, &b));
        let n = i as u64 + 1;
        b.script(&mid(n), [Reply::error(code)]);
        let src = &src;
        async move {
            let (m, _) = src.send(&bob, n).await;
            let (fin, _) = src.wait_terminal(&m).await;
            assert_eq!((fin["status"].as_str(), error_code(&fin)), (Some("failed"), *code), "{fin}");
            (code, m)
        }
    });
    let done = futures_util::future::join_all(cases).await;
    src.later_retries_ran(&b, 100).await;
    for (code, m) in done {
        assert_eq!(b.deliveries(&m).len(), 1, "{code}: no attempt after the delivery ended");
        let st = src.status(&m).await;
        assert_eq!(error_code(&st), *code, "{code}: terminal state is stable: {st}");
    }
}

/// Seed row: "Unrecognized remote error code" → "End delivery with
/// `error.code` set to `bad_gateway`" (whatever the HTTP status).
#[actix_rt::test]
async fn unrecognized_remote_error_code_ends_delivery_with_bad_gateway() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    let src = Source::start(&dir, &[&b], FAST, "20s").await;
    let replies = [
        Reply::Error(418, "teapot".into(), None),
        Reply::Error(503, "server_on_fire".into(), Some(json!({"retry_after": 1}))),
    ];
    let mut ended = vec![];
    for (i, reply) in replies.into_iter().enumerate() {
        let bob = recipient(80 + i as u8);
        b.set_route(&bob.id, route(&bob, 1, &b));
        let m = mid(i as u64 + 1);
        b.script(&m, [reply.clone()]);
        let (m, _) = src.send(&bob, i as u64 + 1).await;
        let (fin, _) = src.wait_terminal(&m).await;
        assert_eq!((fin["status"].as_str(), error_code(&fin)), (Some("failed"), "bad_gateway"), "{reply:?}: {fin}");
        ended.push(m);
    }
    src.later_retries_ran(&b, 100).await;
    for m in ended {
        assert_eq!(b.deliveries(&m).len(), 1, "{m}: no attempt after the delivery ended");
    }
}

/// Seed: "When `rate_limited` carries valid `data.retry_after`, the source
/// MUST also observe the minimum wait".
#[actix_rt::test]
async fn rate_limited_with_retry_after_waits_at_least_that_long_before_the_next_attempt() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    let src = Source::start(&dir, &[&b], FAST, "20s").await;
    let bob = recipient(90);
    b.set_route(&bob.id, route(&bob, 1, &b));
    b.script(&mid(1), [Reply::error_with("rate_limited", json!({"retry_after": 1})), Reply::Accept]);
    let (m, sent) = src.send(&bob, 1).await;
    assert_eq!(sent["status"], "delivering", "{sent}");
    let (fin, _) = src.wait_terminal(&m).await;
    assert_eq!(fin["status"], "target_accepted", "{fin}");
    let d = b.deliveries(&m);
    assert_eq!(d.len(), 2);
    let gap = d[1].at.duration_since(d[0].at);
    assert!(gap >= Duration::from_millis(900), "next attempt {gap:?} after rate_limited with retry_after = 1 s");
    assert_same_bodies("rate_limited", &d);
}

/// Seed row: "Deadline reached before completion" → "End delivery with
/// `error.code` set to `message_expired`"; no attempt after the deadline,
/// and no immediate request loop before it.
#[actix_rt::test]
async fn deadline_reached_before_completion_ends_delivery_with_message_expired() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    b.set_default(Reply::error("temporarily_unavailable"));
    let src = Source::start(&dir, &[&b], FAST, "3s").await;
    let bob = recipient(91);
    b.set_route(&bob.id, route(&bob, 1, &b));
    let m = mid(1);
    let created_at = now();
    let sent = src.client.ok("message.send", src.alice.token(0), &src.params(&bob, &m, created_at)).await;
    assert_eq!(sent["status"], "delivering", "{sent}");
    let accepted_at = sent["accepted_at"].as_u64().unwrap();
    // min(created_at + delivery_age_limit, accepted_at + message_retention)
    let deadline_ms = (created_at + 3).min(accepted_at + 30 * 86400) * 1000;
    let (fin, _) = src.wait_terminal(&m).await;
    let ended_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    assert_eq!((fin["status"].as_str(), error_code(&fin)), (Some("failed"), "message_expired"), "{fin}");
    assert!(ended_ms <= deadline_ms + 1500, "ended {} ms after the deadline", ended_ms.saturating_sub(deadline_ms));
    src.later_retries_ran(&b, 100).await;
    let d = b.deliveries(&m);
    assert!(d.len() >= 3, "retried before the deadline: {} attempts", d.len());
    // Slots are 200 ms apart and the deadline is at most 3 s after acceptance.
    assert!(d.len() <= 3000 / 200 + 2, "{} attempts in under 3 s: a request loop", d.len());
    for r in &d {
        assert!(r.unix_ms < deadline_ms + 100, "attempt {} ms after the deadline", r.unix_ms - deadline_ms);
    }
    assert_same_bodies("expiring", &d);
    assert_eq!(error_code(&src.status(&m).await), "message_expired");
}

/// Seed: "Waiting does not change the fixed deadline. If still unfinished at
/// the deadline, end delivery …; do not extend delivery responsibility or
/// retry after the deadline to satisfy a waiting hint."
#[actix_rt::test]
async fn rate_limited_wait_beyond_the_deadline_does_not_extend_delivery() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    let src = Source::start(&dir, &[&b], FAST, "3s").await;
    let bob = recipient(99);
    b.set_route(&bob.id, route(&bob, 1, &b));
    let m = mid(1);
    b.script(&m, [Reply::error_with("rate_limited", json!({"retry_after": 60}))]); // then Accept
    let created_at = now();
    let sent = src.client.ok("message.send", src.alice.token(0), &src.params(&bob, &m, created_at)).await;
    let deadline_ms = (created_at + 3) * 1000;
    let (fin, _) = src.wait_terminal(&m).await;
    let ended_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    assert_eq!((fin["status"].as_str(), error_code(&fin)), (Some("failed"), "message_expired"), "{fin} (sent {sent})");
    assert!(ended_ms <= deadline_ms + 1500, "ended {} ms after the deadline", ended_ms.saturating_sub(deadline_ms));
    src.later_retries_ran(&b, 100).await;
    assert_eq!(b.deliveries(&m).len(), 1, "no attempt before the wait is over, none after the deadline");
}

// ---- Delivery Result Confirmation and Destination Relay Switching ---------------------

/// Seed: "When a timeout … leaves receipt unknown, the source confirms with
/// the original target …; it retries `message.deliver` unchanged."
#[actix_rt::test]
async fn timeout_leaves_receipt_unknown_and_is_confirmed_with_the_unchanged_request_to_the_same_target() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    let src = Source::start(&dir, &[&b], FAST, "20s").await;
    let bob = recipient(92);
    b.set_route(&bob.id, route(&bob, 1, &b));
    let m = mid(1);
    b.script(&m, [Reply::Hang(HANG), Reply::Accept]);
    let params = src.params(&bob, &m, now());
    let sent = src.client.ok("message.send", src.alice.token(0), &params).await;
    assert_eq!(sent["status"], "delivering", "a timed-out attempt proves nothing: {sent}");
    let (fin, _) = src.wait_terminal(&m).await;
    assert_eq!(fin["status"], "target_accepted", "{fin}");
    src.later_retries_ran(&b, 100).await;
    let d = b.deliveries(&m);
    assert_eq!(d.len(), 2, "the hung attempt and one confirmation");
    assert_same_bodies("timeout", &d);
    for r in &d {
        assert_signed_by_source(r, &src.key, "relay-b");
    }
    // The forwarded request: original envelope and recipient boxes, the
    // sending device's certificate; sender boxes stay at the source.
    let body = d[0].json();
    assert_eq!(body["envelope"], params["envelope"]);
    assert_eq!(body["recipient_boxes"], params["recipient_boxes"]);
    assert_eq!(body["sender_device_certificate"]["device_id"], "phone");
    assert!(body.get("sender_boxes").is_none(), "sender boxes must not leave the source: {body}");
    assert!(d[1].at.duration_since(d[0].at) >= Duration::from_millis(700), "the retry came before the timeout");
}

/// Seed: a disconnection / lost response is confirmed with the unchanged
/// request; the destination's idempotent answer completes the delivery.
#[actix_rt::test]
async fn lost_response_after_commit_is_confirmed_and_the_duplicate_answer_completes_delivery() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    let src = Source::start(&dir, &[&b], FAST, "20s").await;
    let bob = recipient(93);
    b.set_route(&bob.id, route(&bob, 1, &b));
    let m = mid(1);
    b.script(&m, [Reply::Drop, Reply::Accept]);
    let (m, sent) = src.send(&bob, 1).await;
    assert_eq!(sent["status"], "delivering", "a lost response proves nothing: {sent}");
    let (fin, _) = src.wait_terminal(&m).await;
    assert_eq!(fin["status"], "target_accepted", "{fin}");
    assert_eq!(fin["accepted_at"], sent["accepted_at"]);
    src.later_retries_ran(&b, 100).await;
    let d = b.deliveries(&m);
    assert_eq!(d.len(), 2, "the committed-but-unanswered attempt and one confirmation");
    assert_same_bodies("dropped", &d);
    assert!(b.committed(&m));
}

/// Seed: "Switching targets is permitted only if the original target
/// explicitly rejects this receipt with a route error …. The new target MUST
/// be designated by a valid route with a higher `revision`."
#[actix_rt::test]
async fn route_error_switches_to_the_relay_of_a_higher_revision_route() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    let c = FakePeer::start("relay-c", dir.path(), 32);
    let src = Source::start(&dir, &[&b, &c], FAST, "20s").await;
    let bob = recipient(94);
    let moved = route(&bob, 2, &c);
    b.set_route(&bob.id, route(&bob, 1, &b));
    b.set_route_after(&bob.id, 1, moved.clone());
    let m = mid(1);
    b.script(&m, [Reply::error_with("route_stale", json!({"route": moved}))]);
    let (m, sent) = src.send(&bob, 1).await;
    assert_eq!(sent["status"], "delivering", "{sent}");
    let (fin, _) = src.wait_terminal(&m).await;
    assert_eq!(fin["status"], "target_accepted", "{fin}");
    src.later_retries_ran(&b, 100).await;
    let (db, dc) = (b.deliveries(&m), c.deliveries(&m));
    assert_eq!(db.len(), 1, "relay-b rejected with route_stale; no more attempts there");
    assert_eq!(dc.len(), 1, "the retry goes to relay-c of route revision 2");
    assert!(dc[0].body == db[0].body, "the switched attempt carries the unchanged request");
    assert_signed_by_source(&dc[0], &src.key, "relay-c");
    assert!(b.route_gets(&bob.id).iter().any(|r| r.seq > db[0].seq), "the route was refreshed after the route error");
}

/// Seed: the source "MUST NOT deliver an unknown-result message to another
/// relay merely because the original target is temporarily unreachable" —
/// even when it knows a higher-revision route naming another relay.
#[actix_rt::test]
async fn unknown_result_is_confirmed_with_the_original_target_despite_a_higher_revision_route() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    let c = FakePeer::start("relay-c", dir.path(), 32);
    // A retry 3 s after acceptance, so a second message can teach the source
    // the newer route before the first message's confirmation attempt.
    let slow =
        "[delivery]\nretry_timetable = [\"0s\", \"3s\"]\nretry_then_every = \"1s\"\nattempt_timeout = \"500ms\"\n";
    let src = Source::start(&dir, &[&b, &c], slow, "20s").await;
    let kinds = [("timeout", Reply::Hang(Duration::from_millis(1500))), ("lost response", Reply::Drop)];
    for (k, (kind, unknown)) in kinds.into_iter().enumerate() {
        let bob = recipient(95 + k as u8);
        b.set_route(&bob.id, route(&bob, 1, &b));
        b.set_route_after(&bob.id, 1, route(&bob, 2, &c));
        let (n1, n2) = (2 * k as u64 + 1, 2 * k as u64 + 2);
        b.script(&mid(n1), [unknown, Reply::Accept]);

        let (m1, sent1) = src.send(&bob, n1).await;
        assert_eq!(sent1["status"], "delivering", "{kind}: {sent1}");
        assert_eq!(b.deliveries(&m1).len(), 1, "{kind}");
        // A new message's first attempt (at relay-b, the route the source
        // knows) is refused with revision 2 (relay-c): the source now knows it.
        let moved = route(&bob, 2, &c);
        b.script(&mid(n2), [Reply::error_with("route_stale", json!({"route": moved}))]);
        let (m2, sent2) = src.send(&bob, n2).await;
        assert_eq!(sent2["status"], "delivering", "{kind}: {sent2}");
        let db2 = b.deliveries(&m2);
        assert_eq!(db2.len(), 1, "{kind}: message 2's first attempt at relay-b");

        let (fin, _) = src.wait_terminal(&m1).await;
        assert_eq!(fin["status"], "target_accepted", "{kind}: {fin}");
        let db = b.deliveries(&m1);
        assert_eq!(db.len(), 2, "{kind}: the unknown result is confirmed at relay-b");
        assert!(db2[0].at < db[1].at, "{kind}: revision 2 was known before the confirmation attempt");
        let (fin2, _) = src.wait_terminal(&m2).await;
        assert_eq!(fin2["status"], "target_accepted", "{kind}: {fin2}");
        assert_eq!(c.deliveries(&m2).len(), 1, "{kind}: message 2 followed revision 2 to relay-c");
        assert_same_bodies(kind, &db);
        assert!(c.deliveries(&m1).is_empty(), "{kind}: message 1 must not be switched to relay-c");
    }
}

/// PROTOCOL §6: "With two relays in the recipient's route, each attempt goes
/// to both in parallel; the first acceptance makes the delivery
/// `target_accepted`", and seed: an unknown receipt is confirmed with the
/// original target before the delivery ends. One home relay's terminal
/// rejection must not end the delivery while the other's receipt is unknown.
#[actix_rt::test]
async fn with_two_home_relays_an_unknown_receipt_at_one_is_confirmed_before_ending_on_the_others_rejection() {
    let dir = tempdir();
    let b = FakePeer::start("relay-b", dir.path(), 31);
    let c = FakePeer::start("relay-c", dir.path(), 32);
    let src = Source::start(&dir, &[&b, &c], FAST, "20s").await;
    let cases = [
        ("device_unknown at relay-b, lost response at relay-c", Reply::error("device_unknown"), Reply::Drop),
        ("teapot at relay-b, timeout at relay-c", Reply::Error(418, "teapot".into(), None), Reply::Hang(HANG)),
    ];
    let mut problems = vec![];
    for (i, (what, at_b, at_c)) in cases.into_iter().enumerate() {
        let bob = recipient(110 + i as u8);
        let both = bob.route(1, &[("relay-b", b.url.as_str()), ("relay-c", c.url.as_str())], now());
        b.set_route(&bob.id, both);
        let m = mid(i as u64 + 1);
        b.set_default(at_b.clone());
        b.script(&m, [at_b.clone(), at_b]);
        c.script(&m, [at_c, Reply::Accept]);
        let (m, _) = src.send(&bob, i as u64 + 1).await;
        let (fin, _) = src.wait_terminal(&m).await;
        let (nb, nc) = (b.deliveries(&m).len(), c.deliveries(&m).len());
        if fin["status"] != "target_accepted" || nc != 2 {
            problems.push(format!(
                "{what}: final {fin}; attempts at relay-b {nb}, at relay-c {nc} (expected target_accepted after a \
                 confirmation attempt at relay-c)"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---- PROTOCOL §3: relay RPC authentication at a real relay ---------------------------

fn relay_headers(id: &str, ts: u64, sig: String) -> Vec<(&str, String)> {
    vec![("Relay-Id", id.to_string()), ("Relay-Timestamp", ts.to_string()), ("Relay-Signature", sig)]
}

/// PROTOCOL §3: "The callee accepts only relays configured in `[[peers]]`
/// with that key and a timestamp within `clock_tolerance`; otherwise
/// `unauthorized`."
#[actix_rt::test]
async fn relay_rpc_is_accepted_only_from_configured_peers_with_valid_signature_and_fresh_timestamp() {
    let dir = tempdir();
    let cluster = Cluster::plan(dir.path(), &["relay-x", "relay-p"]);
    let x = cluster.start("relay-x", "");
    let peer = SigningKey::from_bytes(&[201; 32]); // relay-p's key (member 1)
    let stranger = SigningKey::from_bytes(&[77; 32]);
    let body = serde_json::to_vec(&json!({"account_id": recipient(96).id})).unwrap();
    let other_body = serde_json::to_vec(&json!({"account_id": recipient(97).id})).unwrap();
    let t = now();
    let sign =
        |key: &SigningKey, target: &str, ts: u64, body: &[u8]| sign_relay_request(key, "route.get", target, ts, body);
    let cases: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("no relay headers", vec![]),
        ("Relay-Id not a configured peer", relay_headers("relay-q", t, sign(&stranger, "relay-x", t, &body))),
        (
            "configured peer, signature by another key",
            relay_headers("relay-p", t, sign(&stranger, "relay-x", t, &body)),
        ),
        (
            "configured peer, signature over another body",
            relay_headers("relay-p", t, sign(&peer, "relay-x", t, &other_body)),
        ),
        (
            "configured peer, signature for another target",
            relay_headers("relay-p", t, sign(&peer, "relay-y", t, &body)),
        ),
        ("configured peer, signature for another method", {
            relay_headers("relay-p", t, sign_relay_request(&peer, "message.deliver", "relay-x", t, &body))
        }),
        (
            "good signature, timestamp 10 minutes old",
            relay_headers("relay-p", t - 600, sign(&peer, "relay-x", t - 600, &body)),
        ),
        (
            "good signature, timestamp 10 minutes ahead",
            relay_headers("relay-p", t + 600, sign(&peer, "relay-x", t + 600, &body)),
        ),
        ("configured peer, no timestamp", {
            vec![("Relay-Id", "relay-p".to_string()), ("Relay-Signature", sign(&peer, "relay-x", t, &body))]
        }),
        ("configured peer, no signature", vec![("Relay-Id", "relay-p".into()), ("Relay-Timestamp", t.to_string())]),
    ];
    for (what, headers) in cases {
        let (status, v) = relay_post(&x.url, "route.get", &headers, &body).await;
        assert_eq!((status, v["error"]["code"].as_str()), (401, Some("unauthorized")), "{what}: {v}");
        assert_valid("ErrorResponse.schema.json", &v);
    }
    // Control: the same call correctly signed by relay-p passes
    // authentication (relay-x knows no route for that account).
    let (status, v) =
        relay_post(&x.url, "route.get", &relay_headers("relay-p", t, sign(&peer, "relay-x", t, &body)), &body).await;
    assert_eq!((status, v["error"]["code"].as_str()), (404, Some("route_not_found")), "{v}");
}
