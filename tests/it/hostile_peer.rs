//! What a hostile peer, or a stranger's text passed along by one, can make a
//! relay keep or print (issue 38, items 6 and 9): a peer's error text is
//! kept bounded, `relay audit` prints no control character from its store,
//! a route names only http(s) URLs, and a captured relay request does not
//! replay. Real relays on loopback; the hostile peer is a scripted fake
//! (`common::fake_peer`) or raw requests signed with a configured peer's key.

use crate::common;

use common::client::{mid, now, relay_post, resign, Client, User};
use common::cluster::{write_key, Cluster};
use common::fake_peer::{FakePeer, Reply};
use common::relay::{audit, RelayProc};
use common::wait::eventually;
use ed25519_dalek::SigningKey;
use relay_schemas::client::Account;
use relay_schemas::sign::{sign_relay_request, Tag};
use serde_json::{json, Value};
use std::time::Duration;

/// Attempts at +0, +200, +400 ms from acceptance, then every 200 ms.
const FAST: &str = r#"[delivery]
retry_timetable = ["0s", "200ms", "400ms"]
retry_then_every = "200ms"
attempt_timeout = "800ms"
"#;

/// What a hostile peer puts in an error: terminal escapes (clear screen,
/// retitle, C1 CSI), a forged line, and megabytes of text and `data`.
fn hostile_error(code: &str) -> Vec<u8> {
    let message =
        format!("\u{1b}[2J\u{1b}]0;owned\u{7}\r\nfinal status: target_accepted\n\u{9b}31m{}", "A".repeat(4 << 20));
    let body = json!({"error": {"code": code, "message": message, "data": {"junk": "B".repeat(1 << 20)}}});
    serde_json::to_vec(&body).unwrap()
}

fn has_terminal_controls(text: &str) -> bool {
    text.chars().any(|c| c.is_control() && c != '\n' && c != '\t')
}

/// Issue 38 item 6: a peer's error `message` was stored in full on every
/// attempt (4 MB each) and `relay audit message` printed it raw.
#[actix_rt::test]
async fn a_peers_error_text_is_kept_bounded_and_printed_without_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let b = FakePeer::start("relay-b", dir.path(), 61);
    write_key(&dir.path().join("relay-a").join("relay.key"), [160; 32]);
    let mut relay = RelayProc::start(dir.path(), "relay-a", &format!("{}{FAST}", b.peer_toml()));
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 1, false).await;
    let bob = Account::from_seed([62; 32]);
    b.set_route(&bob.id, bob.route(1, &[(b.id.as_str(), b.url.as_str())], now()));
    let m = mid(1);
    let refusals = [
        Reply::Raw(503, hostile_error("temporarily_unavailable")),
        Reply::Raw(503, hostile_error("temporarily_unavailable")),
        Reply::Raw(403, hostile_error("forbidden")),
    ];
    b.script(&m, refusals);
    let params = alice.params_to(0, &bob.id, &m, now(), &["phone"], Some(&["phone"]));
    c.ok("message.send", alice.token(0), &params).await;
    let status = eventually("the delivery ends", Duration::from_secs(20), || async {
        let st = c.ok("message.delivery.status", alice.token(0), &json!({"message_id": m})).await;
        if st["status"] == "delivering" {
            Err(st.to_string())
        } else {
            Ok(st)
        }
    })
    .await;
    assert_eq!((status["status"].as_str(), status["error"]["code"].as_str()), (Some("failed"), Some("forbidden")));
    let shown = status["error"]["message"].as_str().unwrap();
    assert!(shown.len() <= 512, "the sender is shown {} bytes of the peer's text", shown.len());
    assert!(!has_terminal_controls(shown), "{shown:?}");
    assert!(status["error"].get("data").is_none(), "no member of data the protocol defines: {status}");
    assert_eq!(b.deliveries(&m).len(), 3);

    relay.terminate();
    let config = relay.config.to_str().unwrap();
    let (code, story, err) = audit(&["message", alice.id(), &m, "--config", config]);
    assert_eq!(code, 0, "{err}");
    assert!(!has_terminal_controls(&story), "{story}");
    assert!(story.len() < 16 << 10, "the story of three attempts is {} bytes", story.len());
    let forged = story.lines().filter(|l| l.starts_with("final status:")).count();
    assert_eq!(forged, 1, "a peer cannot forge a line:\n{story}");
    let stream = format!("delivery/{}/{m}", alice.id());
    let (code, export, err) = audit(&["export", "--stream", &stream, "--config", config]);
    assert_eq!(code, 0, "{err}");
    let errors: Vec<Value> = export
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|ev| ev.pointer("/data/attempt_failed/error").cloned())
        .collect();
    assert!(errors.len() >= 2, "every refused attempt kept its error:\n{export}");
    for e in &errors {
        let kept = e["message"].as_str().unwrap();
        assert!(kept.len() <= 512 && !has_terminal_controls(kept), "kept {} bytes: {:?}", kept.len(), &kept[..40]);
        assert!(e.get("data").is_none(), "{e}");
    }
}

/// Issue 38 item 6: `relay audit` escapes every control character of what
/// it prints, whoever wrote it: here an unknown member of a signed envelope
/// (kept byte for byte, PROTOCOL §1) carrying DEL and a C1 CSI, which JSON
/// leaves raw.
#[actix_rt::test]
async fn relay_audit_prints_no_raw_control_character_from_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let mut relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 3, false).await;
    let m = mid(7);
    let mut params = alice.self_params(&m, &["phone"]);
    let note = "\u{9b}2J\u{7f}\u{85}note";
    let mut env = params["envelope"].clone();
    env["x-note"] = json!(note);
    params["envelope"] = resign(Tag::Envelope, &env, &alice.devices[0].key);
    c.ok("message.send", alice.token(0), &params).await;
    relay.terminate();

    let config = relay.config.to_str().unwrap();
    let stream = format!("account/{}", alice.id());
    let (code, export, err) = audit(&["export", "--stream", &stream, "--config", config]);
    assert_eq!(code, 0, "{err}");
    assert!(!has_terminal_controls(&export), "raw control characters in:\n{export}");
    assert!(export.contains("\\u009b2J\\u007f\\u0085note"), "{export}");
    let notes: Vec<Value> = export
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("still JSON lines"))
        .filter(|ev| ev.to_string().contains("x-note"))
        .collect();
    assert!(!notes.is_empty(), "the envelope's event is exported:\n{export}");
    assert!(notes.iter().any(|ev| ev.to_string().contains(note)), "the same string once parsed:\n{export}");
    for args in [vec!["replay", "--stream", &stream, "--events"], vec!["message", alice.id(), &m]] {
        let mut args = args.clone();
        args.extend(["--config", config]);
        let (code, out, err) = audit(&args);
        assert_eq!(code, 0, "{args:?}: {err}");
        assert!(!has_terminal_controls(&out), "{args:?}:\n{out}");
    }
}

/// Issue 38 item 6: a route's `relays[].url` is where other relays POST, so
/// only an http(s) URL with a host is a route.
#[actix_rt::test]
async fn a_route_naming_anything_but_an_http_or_https_url_is_invalid_params() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start(dir.path(), "relay-a", "");
    let c = Client::new(&relay.url);
    let alice = User::register(&c, "relay-a", 4, false).await;
    for bad in ["javascript:alert(1)", "file:///etc/passwd", "relay.example", "http://x/\u{1b}[2J", "https://"] {
        let route = alice.account.route(2, &[("relay-a", bad)], now());
        assert_eq!(c.err("route.update", alice.token(0), &json!({"route": route})).await, "invalid_params", "{bad:?}");
        let stranger = Account::from_seed([40; 32]);
        let cert = stranger.certificate(&alice.devices[0], now(), None);
        let route = stranger.route(1, &[("relay-a", bad)], now());
        let reg = stranger.register_params(&route, &cert, "relay-a", false, now());
        assert_eq!(c.err("account.register", None, &reg).await, "invalid_params", "{bad:?}");
    }
    let route = c.ok("route.get", alice.token(0), &json!({"account_id": alice.id()})).await;
    assert_eq!(route["revision"], 1, "nothing changed: {route}");
}

/// Issue 38 item 9: a captured signed relay request verified again for
/// ±`clock_tolerance`. Now the same signature in its window is not carried
/// out again: it gets the first one's answer (what an honest source that
/// repeats itself within a second needs) and spends no budget. relay-p's
/// lookup budget holds one request: had a replay been carried out, it would
/// have been `rate_limited` (four loopback calls take far less than the
/// second a token takes to come back).
#[actix_rt::test]
async fn a_captured_relay_request_is_not_carried_out_again_when_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::plan(dir.path(), &["relay-x", "relay-p"]);
    let x = cluster.start("relay-x", "[limits]\npeer_lookup_rate = 1\npeer_lookup_burst = 1\n");
    let peer = SigningKey::from_bytes(&[201; 32]); // relay-p's key (member 1)
    let body = serde_json::to_vec(&json!({"account_id": Account::from_seed([96; 32]).id})).unwrap();
    let t = now();
    let headers = |ts: u64, body: &[u8]| {
        vec![
            ("Relay-Id", "relay-p".to_string()),
            ("Relay-Timestamp", ts.to_string()),
            ("Relay-Signature", sign_relay_request(&peer, "route.get", "relay-x", ts, body)),
        ]
    };
    let captured = headers(t, &body);
    let (status, first) = relay_post(&x.url, "route.get", &captured, &body).await;
    assert_eq!((status, first["error"]["code"].as_str()), (404, Some("route_not_found")), "{first}");
    for _ in 0..3 {
        let (status, again) = relay_post(&x.url, "route.get", &captured, &body).await;
        assert_eq!((status, &again), (404, &first), "a replay gets the first answer");
    }
    // The same call signed again (another timestamp) is a new request: it
    // finds the budget the first one spent, and only that one, gone.
    let (status, fresh) = relay_post(&x.url, "route.get", &headers(t + 1, &body), &body).await;
    assert_eq!((status, fresh["error"]["code"].as_str()), (429, Some("rate_limited")), "{fresh}");
    assert!(!fresh["error"]["message"].as_str().unwrap_or("").contains("replayed"), "{fresh}");
}
