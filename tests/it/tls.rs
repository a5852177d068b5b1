//! TLS on the relay's own listener (`http.tls_cert_file`/`tls_key_file`),
//! its reload on SIGHUP, and relay-to-relay calls over `https://` that
//! verify the peer's certificate (a test CA made here, trusted through
//! `http.tls_extra_roots`).

use crate::common;

use common::client::{mid, Client, User};
use common::cluster::Cluster;
use common::http::read_message;
use common::relay::RelayProc;
use common::tls::{Issued, TestCa};
use common::wait::eventually_blocking;
use common::ws::WsClient;
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

type TlsStream = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to `url` (https://127.0.0.1:port), handshake done.
fn tls_connect(url: &str, config: Arc<rustls::ClientConfig>) -> TlsStream {
    let tcp = TcpStream::connect(url.trim_start_matches("https://")).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut s = rustls::StreamOwned::new(rustls::ClientConnection::new(config, name).unwrap(), tcp);
    s.conn.complete_io(&mut s.sock).expect("TLS handshake");
    s
}

/// The leaf certificate the relay showed on `s`.
fn served(s: &TlsStream) -> Vec<u8> {
    s.conn.peer_certificates().expect("a certificate")[0].to_vec()
}

/// `GET /healthz` on a kept-alive connection: the status line.
fn healthz(s: &mut TlsStream) -> Option<String> {
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let m = read_message(s)?;
    Some(m.head.line)
}

/// The `[http]` section of a relay serving `cert`.
fn tls_http(cert: &Issued) -> String {
    format!("[http]\n{}", cert.http_lines())
}

#[actix_rt::test]
async fn a_relay_with_tls_serves_https_and_wss_and_answers_nothing_in_plain_http() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "test-ca");
    let cert = ca.issue(dir.path(), "relay-a");
    let relay = RelayProc::start(dir.path(), "relay-a", &tls_http(&cert));
    assert!(relay.url.starts_with("https://"), "{}", relay.url);

    let c = Client::with_http(&relay.url, ca.http());
    assert_eq!(c.get("/healthz").await.0, 200);
    let mut ws = WsClient::connect_with(&ca.http(), &relay.url, None).await;
    let answer = ws.call("route.get", json!({"account_id": "unknown"})).await;
    assert!(answer.get("error").is_some() || answer.get("result").is_some(), "{answer}");

    // webpki's roots alone do not know the test CA: no request is made.
    let stranger = Client::new(&relay.url);
    let refused = stranger.try_get("/healthz").await.expect_err("an unknown issuer is refused");
    assert!(refused.contains("certificate") || refused.contains("UnknownIssuer"), "{refused}");

    // Plain HTTP to the TLS port: no HTTP answer, the connection is closed.
    let mut plain = TcpStream::connect(relay.url.trim_start_matches("https://")).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    plain.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut got = Vec::new();
    plain.read_to_end(&mut got).expect("closed by the relay");
    assert!(!got.starts_with(b"HTTP/"), "{:?}", String::from_utf8_lossy(&got));
    c.assert_healthy().await;
}

#[test]
fn sighup_serves_a_new_certificate_to_new_connections_and_keeps_open_ones_and_a_bad_file_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "test-ca");
    let live = ca.issue(dir.path(), "live");
    let (second, third) = (ca.issue(dir.path(), "second"), ca.issue(dir.path(), "third"));
    let relay = RelayProc::start(dir.path(), "relay-a", &tls_http(&live));
    let hup = || unsafe { libc::kill(relay.pid() as i32, libc::SIGHUP) };
    let config = ca.client_config();

    let mut before = tls_connect(&relay.url, config.clone());
    assert_eq!(served(&before), live.der);
    assert_eq!(healthz(&mut before).as_deref(), Some("HTTP/1.1 200 OK"));

    second.copy_to(&live);
    assert_eq!(hup(), 0);
    eventually_blocking("new connections see the new certificate", Duration::from_secs(10), || {
        let s = tls_connect(&relay.url, config.clone());
        if served(&s) == second.der {
            Ok(())
        } else {
            Err("still the first certificate".into())
        }
    });
    // The connection opened before the reload goes on.
    assert_eq!(healthz(&mut before).as_deref(), Some("HTTP/1.1 200 OK"));

    // A certificate whose key is not the one on file, then a file that is
    // no certificate: each refused, the second certificate stays.
    std::fs::copy(&third.cert, &live.cert).unwrap();
    assert_eq!(hup(), 0);
    relay.wait_for_log(&["TLS certificate reload failed", "live.crt"], Duration::from_secs(10));
    std::fs::write(&live.cert, "not a certificate\n").unwrap();
    assert_eq!(hup(), 0);
    eventually_blocking("both bad reloads logged", Duration::from_secs(10), || {
        match relay.count_log(&["TLS certificate reload failed", "live.crt"]) {
            2 => Ok(()),
            n => Err(format!("{n} failed reloads logged")),
        }
    });
    let mut after = tls_connect(&relay.url, config);
    assert_eq!(served(&after), second.der);
    assert_eq!(healthz(&mut after).as_deref(), Some("HTTP/1.1 200 OK"));
    assert_eq!(healthz(&mut before).as_deref(), Some("HTTP/1.1 200 OK"));
}

#[actix_rt::test]
async fn sighup_to_a_relay_without_tls_only_says_there_is_nothing_to_reload() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start_logged(dir.path(), "relay-a", "", "warn,relay=info");
    assert_eq!(unsafe { libc::kill(relay.pid() as i32, libc::SIGHUP) }, 0);
    relay.wait_for_log(&["SIGHUP", "no TLS certificate to reload"], Duration::from_secs(10));
    Client::new(&relay.url).assert_healthy().await;
    assert!(relay.is_running());
}

#[test]
fn config_check_names_a_missing_or_mismatched_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "test-ca");
    let (one, two) = (ca.issue(dir.path(), "one"), ca.issue(dir.path(), "two"));
    let check = |http: &str| {
        let cfg = common::relay::write_config(dir.path(), "relay-a", http);
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_relay"))
            .args(["config", "check", "--config"])
            .arg(&cfg)
            .output()
            .unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    assert!(check(&tls_http(&one)).0, "a good pair passes");
    let missing = format!("[http]\ntls_cert_file = {:?}\ntls_key_file = {:?}\n", dir.path().join("nope.crt"), one.key);
    let (ok, err) = check(&missing);
    assert!(!ok && err.contains("http.tls_cert_file") && err.contains("nope.crt"), "{err}");
    let mismatched = format!("[http]\ntls_cert_file = {:?}\ntls_key_file = {:?}\n", one.cert, two.key);
    let (ok, err) = check(&mismatched);
    assert!(
        !ok && err.contains("two.key is not the private key of the certificate in") && err.contains("one.crt"),
        "{err}"
    );
    let (ok, err) = check(&format!("[http]\ntls_cert_file = {:?}\ntls_key_file = {:?}\n", one.cert, one.cert));
    assert!(!ok && err.contains("one.crt: no PEM private key in it"), "{err}");
    let (ok, err) = check(&format!("[http]\ntls_cert_file = {:?}\n", one.cert));
    assert!(!ok && err.contains("go together"), "{err}");
    let (ok, err) = check(&format!("[http]\ntls_extra_roots = {:?}\n", one.key));
    assert!(!ok && err.contains("http.tls_extra_roots"), "{err}");
}

/// Relays `relay-a` and `relay-b` over https, each with a certificate of
/// `ca`; `a_trusts` says whether relay-a trusts that CA.
fn https_pair(dir: &std::path::Path, ca: &TestCa, a_trusts: bool) -> (RelayProc, RelayProc) {
    let cluster = Cluster::plan(dir, &["relay-a", "relay-b"]).https();
    let roots = format!("tls_extra_roots = {:?}\n", ca.pem);
    let http = |id: &str, trusts: bool| {
        let cert = ca.issue(dir, id);
        format!("{}{}\n{}", tls_http(&cert), if trusts { roots.as_str() } else { "" }, crate::cross_relay::FAST)
    };
    let a = cluster.start_logged("relay-a", &http("relay-a", a_trusts), "warn");
    let b = cluster.start("relay-b", &http("relay-b", true));
    (a, b)
}

#[actix_rt::test]
async fn relays_deliver_to_each_other_over_https_with_a_private_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "test-ca");
    let (a, b) = https_pair(dir.path(), &ca, true);
    let (ca_client, cb) = (Client::with_http(&a.url, ca.http()), Client::with_http(&b.url, ca.http()));
    let alice = User::register(&ca_client, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    let status = ca_client.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    assert_eq!(status["status"], "target_accepted", "{status}");
    let received = bob.sync_all(&cb, 0).await;
    assert_eq!(common::client::message_ids(&received), vec![mid(1)]);
}

#[actix_rt::test]
async fn a_peer_whose_certificate_does_not_verify_is_never_sent_the_message_and_is_retried() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "test-ca");
    let (a, b) = https_pair(dir.path(), &ca, false);
    let (ca_client, cb) = (Client::with_http(&a.url, ca.http()), Client::with_http(&b.url, ca.http()));
    let alice = User::register(&ca_client, "relay-a", 1, false).await;
    let bob = User::register(&cb, "relay-b", 2, true).await;
    let status = ca_client.ok("message.send", alice.token(0), &alice.send_params(&bob, &mid(1), true)).await;
    assert_eq!(status["status"], "delivering", "{status}");
    // Attempt after attempt (FAST timetable) fails before anything is sent.
    crate::cross_relay::wait_unreached_attempts(&ca_client, 3.0).await;
    a.wait_for_log(&["peer unreachable", "TLS handshake failed", "invalid peer certificate"], Duration::from_secs(10));
    assert!(bob.sync_all(&cb, 0).await.is_empty(), "relay-b accepted nothing");
    let st = ca_client.ok("message.delivery.status", alice.token(0), &json!({"message_id": mid(1)})).await;
    assert_ne!(st["status"], "target_accepted", "{st}");
}
