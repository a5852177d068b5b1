//! A WebSocket test client: requests with ids, notifications buffered in
//! arrival order, close reasons observable.

use awc::ws::{CloseReason, Frame, Message};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::time::Duration;

pub struct WsClient {
    conn: actix_codec::Framed<awc::BoxedSocket, awc::ws::Codec>,
    next_id: u64,
    notifications: VecDeque<Value>,
    closed: Option<Option<CloseReason>>,
}

/// Bound on every wait.
pub const WAIT: Duration = Duration::from_secs(10);

impl WsClient {
    /// Connects to `base` (http://…); with `token`, authenticates by header.
    pub async fn connect(base: &str, token: Option<&str>) -> WsClient {
        let url = format!("{}/v1/ws", base.replacen("http://", "ws://", 1));
        let mut req = awc::Client::new().ws(url).max_frame_size(4 << 20);
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let (_, conn) = req.connect().await.expect("websocket upgrade");
        WsClient { conn, next_id: 0, notifications: VecDeque::new(), closed: None }
    }

    /// Connects and attaches with a first `session.attach` frame.
    pub async fn attach(base: &str, token: &str) -> WsClient {
        let mut c = WsClient::connect(base, None).await;
        let r = c.call("session.attach", json!({ "token": token })).await;
        assert_eq!(r, json!({"result": {}, "id": r["id"]}), "{r}");
        c
    }

    pub async fn send_text(&mut self, text: String) {
        self.conn.send(Message::Text(text.into())).await.expect("send frame");
    }

    /// Reads one frame; returns a JSON text frame, or None once closed.
    async fn read(&mut self, wait: Duration) -> Option<Value> {
        loop {
            if self.closed.is_some() {
                return None;
            }
            let frame = match actix_rt::time::timeout(wait, self.conn.next()).await {
                Err(_) => return None,
                Ok(None) => {
                    self.closed = Some(None);
                    return None;
                }
                Ok(Some(f)) => f.expect("frame"),
            };
            match frame {
                Frame::Text(b) => return Some(serde_json::from_slice(&b).expect("JSON frame")),
                Frame::Ping(b) => {
                    let _ = self.conn.send(Message::Pong(b)).await;
                }
                Frame::Close(reason) => {
                    self.closed = Some(reason);
                    return None;
                }
                _ => {}
            }
        }
    }

    /// A request; returns the whole response frame (`result` or `error`).
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        self.send_text(json!({ "id": id, "method": method, "params": params }).to_string()).await;
        loop {
            let frame = self.read(WAIT).await.unwrap_or_else(|| panic!("no answer to {method} (closed: {:?})", self.closed));
            if frame.get("id") == Some(&json!(id)) {
                return frame;
            }
            assert!(frame.get("id").is_none(), "answer to another request: {frame}");
            self.notifications.push_back(frame);
        }
    }

    /// A request that must succeed; returns its result.
    pub async fn ok(&mut self, method: &str, params: Value) -> Value {
        let r = self.call(method, params).await;
        assert!(r.get("error").is_none(), "{method}: {r}");
        r["result"].clone()
    }

    /// The next notification within `wait`, if any.
    pub async fn notification(&mut self, wait: Duration) -> Option<Value> {
        if let Some(n) = self.notifications.pop_front() {
            return Some(n);
        }
        let frame = self.read(wait).await?;
        assert!(frame.get("id").is_none(), "unexpected answer {frame}");
        Some(frame)
    }

    /// Waits (bounded) for the relay to close the connection; its reason.
    pub async fn closed(&mut self, wait: Duration) -> Option<CloseReason> {
        let deadline = std::time::Instant::now() + wait;
        while self.closed.is_none() && std::time::Instant::now() < deadline {
            if let Some(n) = self.read(deadline - std::time::Instant::now()).await {
                self.notifications.push_back(n);
            }
        }
        self.closed.clone().expect("the relay did not close the connection")
    }
}
