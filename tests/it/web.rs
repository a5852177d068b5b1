//! The embedded web client at `/` and CORS for the client API
//! (`http.cors_origins`; the relay's own origin is always allowed).

use crate::common;

use common::cluster::free_port;
use common::relay::RelayProc;

async fn get(url: &str) -> (u16, String, String, String) {
    let mut r = awc::Client::default().get(url).send().await.unwrap();
    let header = |n: &str| r.headers().get(n).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
    let (ctype, csp) = (header("content-type"), header("content-security-policy"));
    let body = String::from_utf8(r.body().limit(1 << 20).await.unwrap().to_vec()).unwrap();
    (r.status().as_u16(), ctype, csp, body)
}

/// An `OPTIONS` preflight from `origin`: the status and the allowed origin.
async fn preflight(url: &str, origin: &str) -> (u16, Option<String>) {
    let r = awc::Client::default()
        .request(awc::http::Method::OPTIONS, format!("{url}/v1/rpc/message.send"))
        .insert_header(("Origin", origin))
        .insert_header(("Access-Control-Request-Method", "POST"))
        .insert_header(("Access-Control-Request-Headers", "authorization, content-type"))
        .send()
        .await
        .unwrap();
    let allowed = r.headers().get("access-control-allow-origin").map(|v| v.to_str().unwrap().to_owned());
    if r.status().as_u16() == 204 {
        let headers = r.headers().get("access-control-allow-headers").unwrap().to_str().unwrap();
        assert!(headers.contains("authorization") && headers.contains("content-type"));
    }
    (r.status().as_u16(), allowed)
}

#[actix_rt::test]
async fn relay_serves_its_web_client() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start_at(dir.path(), "relay-a", &format!("127.0.0.1:{}", free_port()), "");
    let (status, ctype, csp, body) = get(&format!("{}/", relay.url)).await;
    assert_eq!((status, ctype.as_str()), (200, "text/html; charset=utf-8"));
    assert!(body.contains(r#"<script type="module" src="/app.js"></script>"#));
    assert!(csp.contains("default-src 'self'"), "{csp}");
    let (status, ctype, _, body) = get(&format!("{}/app.js", relay.url)).await;
    assert_eq!((status, ctype.as_str()), (200, "text/javascript; charset=utf-8"));
    assert_eq!(body, include_str!("../../web/dist/app.js"));
    // The service worker, at the root so that its scope is the whole client.
    let (status, ctype, _, body) = get(&format!("{}/sw.js", relay.url)).await;
    assert_eq!((status, ctype.as_str()), (200, "text/javascript; charset=utf-8"));
    assert_eq!(body, include_str!("../../web/dist/sw.js"));
    assert!(body.contains("New message"));
    // The QR decoder, loaded by the page only when it scans without a BarcodeDetector.
    let (status, ctype, _, body) = get(&format!("{}/scan.js", relay.url)).await;
    assert_eq!((status, ctype.as_str()), (200, "text/javascript; charset=utf-8"));
    assert_eq!(body, include_str!("../../web/dist/scan.js"));
    let (status, _, _, body) = get(&format!("{}/client.json", relay.url)).await;
    assert_eq!(status, 200);
    let info: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(info, serde_json::json!({"relay_id": "relay-a", "public_url": relay.url}));
    // The icon browsers ask for on their own: none, and no 404 either.
    let r = awc::Client::default().get(format!("{}/favicon.ico", relay.url)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert_eq!(r.headers().get("cache-control").unwrap(), "max-age=86400");
}

#[actix_rt::test]
async fn cors_allows_the_own_origin_and_configured_ones_only() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let relay =
        RelayProc::start_at(dir.path(), "relay-a", &listen, "[http]\ncors_origins = [\"http://app.example\"]\n");
    let own = relay.url.clone();
    assert_eq!(preflight(&relay.url, &own).await, (204, Some(own.clone())));
    assert_eq!(preflight(&relay.url, "http://app.example").await, (204, Some("http://app.example".into())));
    assert_eq!(preflight(&relay.url, "http://evil.example").await, (403, None));

    // Answers carry the allowed origin back, and only to allowed origins.
    for (origin, allowed) in [("http://app.example", true), ("http://evil.example", false)] {
        let r = awc::Client::default()
            .post(format!("{}/v1/rpc/route.get", relay.url))
            .insert_header(("Origin", origin))
            .send_json(&serde_json::json!({"account_id": "00000000000000000000000000000000"}))
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 404);
        let acao = r.headers().get("access-control-allow-origin").map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(acao, allowed.then(|| origin.to_owned()), "{origin}");
    }
}

#[actix_rt::test]
async fn without_cors_origins_only_the_own_origin_is_allowed() {
    let dir = tempfile::tempdir().unwrap();
    let relay = RelayProc::start_at(dir.path(), "relay-a", &format!("127.0.0.1:{}", free_port()), "");
    assert_eq!(preflight(&relay.url, &relay.url).await.0, 204);
    assert_eq!(preflight(&relay.url, "http://app.example").await, (403, None));
}
