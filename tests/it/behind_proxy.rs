//! The relay behind a real reverse proxy (Debian's nginx, TLS at the
//! proxy, `http.trusted_proxies = ["127.0.0.1"]`): clients at distinct
//! loopback addresses (127.0.0.2, 127.0.0.3) are limited each on its own,
//! whatever `X-Forwarded-For` they forge, a WebSocket and its
//! notifications pass through, and a client that connects directly is
//! itself whatever header it sends. Needs nginx (`.ci/run` installs it);
//! elsewhere a missing nginx skips with a message, under `CI=true` it fails.

use crate::common;

use common::client::{mid, Client, User};
use common::nginx::Nginx;
use common::relay::RelayProc;
use common::tls::TestCa;
use common::wait::eventually;
use common::ws::{WsClient, WAIT};
use serde_json::json;
use std::net::IpAddr;
use std::time::Duration;

const A: &str = "127.0.0.2";
const B: &str = "127.0.0.3";
const C: &str = "127.0.0.4";

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A relay trusting the proxy at 127.0.0.1 (`extra`: more config), nginx
/// in front of it with a certificate of `ca`.
fn behind_nginx(dir: &std::path::Path, ca: &TestCa, extra: &str, rust_log: &str) -> (RelayProc, Nginx) {
    let relay = RelayProc::start_logged(
        dir,
        "relay-a",
        &format!("[http]\ntrusted_proxies = [\"127.0.0.1/32\"]\n{extra}"),
        rust_log,
    );
    let nginx = Nginx::start(dir, &relay.url, &ca.issue(dir, "nginx"));
    (relay, nginx)
}

#[actix_rt::test]
async fn behind_a_trusted_proxy_each_client_has_its_own_rate_limit_and_cannot_forge_another_address() {
    if !common::can_run(
        "behind_a_trusted_proxy_each_client_has_its_own_rate_limit_and_cannot_forge_another_address",
        common::nginx::missing(),
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "test-ca");
    let limits = "[limits]\nanonymous_rate = 1\nanonymous_burst = 3\n";
    let (_relay, nginx) = behind_nginx(dir.path(), &ca, limits, "warn");
    let (a, b) = (ca.http_from(ip(A)), ca.http_from(ip(B)));

    // Client A forges a new X-Forwarded-For on every session-less call: were
    // it believed, each call would have a fresh budget and none be refused.
    let mut refused = None;
    for n in 0..30 {
        let forged = format!("198.51.100.{n}");
        let mut resp = a
            .post(format!("{}/v1/rpc/route.get", nginx.url))
            .insert_header(("X-Forwarded-For", forged))
            .content_type("application/json")
            .send_body(r#"{"account_id":"00000000000000000000000000000000"}"#)
            .await
            .unwrap();
        if resp.status() == 429 {
            let body: serde_json::Value = resp.json().await.unwrap();
            refused = Some((n, body));
            break;
        }
    }
    let (n, body) = refused.expect("client A is refused within 30 calls");
    assert!(n >= 3, "the burst of 3 was served first ({n} calls served)");
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");

    // Client B, through the same proxy (so from the same TCP peer), has its own.
    let cb = Client::with_http(&nginx.url, b);
    let (status, answer) = cb.call("route.get", None, &json!({"account_id": "00000000000000000000000000000000"})).await;
    assert_ne!(status, 429, "{answer}");
}

#[actix_rt::test]
async fn behind_a_trusted_proxy_websockets_and_notifications_pass_are_capped_per_client_and_logged_with_the_client() {
    if !common::can_run(
        "behind_a_trusted_proxy_websockets_and_notifications_pass_are_capped_per_client_and_logged_with_the_client",
        common::nginx::missing(),
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "test-ca");
    // Two connections per address: the proxy's own are many more.
    let extra = "max_connections_per_ip = 2\n[log]\naccess = true\n";
    let (relay, nginx) = behind_nginx(dir.path(), &ca, extra, "warn,relay::access=info");
    let (a, b) = (ca.http_from(ip(A)), ca.http_from(ip(B)));
    let cb = Client::with_http(&nginx.url, b.clone());
    let alice = User::register(&cb, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-a", 2, true).await;

    // Bob's WebSockets from client A: two, then the cap.
    let token = bob.token(0);
    let mut first = WsClient::connect_with(&a, &nginx.url, token).await;
    let second = WsClient::connect_with(&a, &nginx.url, token).await;
    assert_eq!(WsClient::try_connect_with(&a, &nginx.url, token).await.err(), Some(429));
    // Client B has its own: the proxy's connections are not capped at 2.
    let mut from_b = WsClient::connect_with(&b, &nginx.url, token).await;

    // A notification passes through the proxy to every open WebSocket.
    cb.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    for ws in [&mut first, &mut from_b] {
        let n = ws.notification(WAIT).await.expect("timeline notification through nginx");
        assert_eq!(n, json!({"method": "message.timeline.changed", "params": {"account_id": bob.id(), "sequence": 1}}));
    }
    let page = first.ok("message.timeline.sync", json!({"after": 0})).await;
    assert_eq!(page["records"][0]["envelope"]["message_id"], mid(1));

    // A closed WebSocket frees its client's slot.
    second.close().await;
    eventually("client A may open another WebSocket", Duration::from_secs(10), || async {
        match WsClient::try_connect_with(&a, &nginx.url, token).await {
            Ok(_) => Ok(()),
            Err(status) => Err(format!("HTTP {status}")),
        }
    })
    .await;

    // A client connecting directly (not a trusted proxy) is itself, whatever
    // header it sends, and its connections are capped at 2 as before.
    let direct = awc::Client::builder().local_address(ip(C)).finish();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut req = direct.ws(format!("{}/v1/ws", relay.url.replacen("http", "ws", 1)));
        req = req.header("X-Forwarded-For", B).bearer_auth(token.unwrap());
        held.push(req.connect().await.expect("a direct WebSocket within the cap").1);
    }
    assert_eq!(WsClient::try_connect_with(&direct, &relay.url, token).await.err(), Some(429));
    relay.wait_for_log(&["relay::access", &format!("client={C}"), "path=/v1/ws", "status=101"], WAIT);

    // The access log names the clients, never the proxy.
    relay.wait_for_log(&["relay::access", &format!("client={B}"), "path=/v1/rpc/message.send", "status=200"], WAIT);
    relay.wait_for_log(&["relay::access", &format!("client={A}"), "path=/v1/ws", "status=101"], WAIT);
    assert_eq!(relay.count_log(&["relay::access", "client=127.0.0.1 "]), 0, "{:#?}", relay.log_lines());
}
