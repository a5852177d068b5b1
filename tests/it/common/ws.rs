//! A WebSocket test client: requests with ids, notifications buffered in
//! arrival order, close reasons observable.

use super::ws_frame::{client_frame, parse_frame};
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
        WsClient::connect_with(&awc::Client::new(), base, token).await
    }

    /// Like [`WsClient::connect`], with client `http` (`https://` bases
    /// become `wss://`).
    pub async fn connect_with(http: &awc::Client, base: &str, token: Option<&str>) -> WsClient {
        let url = format!("{}/v1/ws", base.replacen("http", "ws", 1));
        let mut req = http.ws(url).max_frame_size(4 << 20);
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let (_, conn) = req.connect().await.expect("websocket upgrade");
        WsClient { conn, next_id: 0, notifications: VecDeque::new(), closed: None }
    }

    /// Like [`WsClient::connect`], but a refused upgrade is the HTTP status.
    pub async fn try_connect(base: &str, token: Option<&str>) -> Result<WsClient, u16> {
        WsClient::try_connect_with(&awc::Client::new(), base, token).await
    }

    /// Like [`WsClient::try_connect`], with client `http`.
    pub async fn try_connect_with(http: &awc::Client, base: &str, token: Option<&str>) -> Result<WsClient, u16> {
        let url = format!("{}/v1/ws", base.replacen("http", "ws", 1));
        let mut req = http.ws(url).max_frame_size(4 << 20);
        if let Some(t) = token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        match req.connect().await {
            Ok((_, conn)) => Ok(WsClient { conn, next_id: 0, notifications: VecDeque::new(), closed: None }),
            Err(awc::error::WsClientError::InvalidResponseStatus(s)) => Err(s.as_u16()),
            Err(e) => panic!("websocket upgrade: {e}"),
        }
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
        let deadline = std::time::Instant::now() + wait;
        loop {
            if self.closed.is_some() {
                return None;
            }
            let frame = match actix_rt::time::timeout(
                deadline.saturating_duration_since(std::time::Instant::now()),
                self.conn.next(),
            )
            .await
            {
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
            let frame =
                self.read(WAIT).await.unwrap_or_else(|| panic!("no answer to {method} (closed: {:?})", self.closed));
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

    /// Sends a raw text frame and returns the next answer frame (one with an
    /// `id` member), buffering notifications that come first.
    pub async fn call_raw(&mut self, text: &str) -> Value {
        self.send_text(text.to_string()).await;
        self.answer().await
    }

    /// The next answer frame (one with an `id` member), buffering
    /// notifications that come first.
    pub async fn answer(&mut self) -> Value {
        loop {
            let frame = self.read(WAIT).await.unwrap_or_else(|| panic!("no answer (closed: {:?})", self.closed));
            if frame.get("id").is_some() {
                return frame;
            }
            self.notifications.push_back(frame);
        }
    }

    /// Notifications that arrived before the answers read so far (and were
    /// not taken yet): deterministic, no waiting.
    pub fn buffered(&mut self) -> Vec<Value> {
        self.notifications.drain(..).collect()
    }

    /// Sends a binary frame (not part of the protocol).
    pub async fn send_binary(&mut self, bytes: Vec<u8>) {
        self.conn.send(Message::Binary(bytes.into())).await.expect("send frame");
    }

    /// Closes from the client side (a device going offline).
    pub async fn close(mut self) {
        let _ = self.conn.send(Message::Close(None)).await;
        let _ = actix_rt::time::timeout(WAIT, async { while self.conn.next().await.is_some() {} }).await;
    }

    /// Whether the relay closed the connection (as far as read so far).
    pub fn is_closed(&self) -> bool {
        self.closed.is_some()
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

/// The close code and reason of a close frame.
pub fn close_code(reason: &Option<CloseReason>) -> (u16, String) {
    let r = reason.as_ref().expect("a close frame with a reason");
    (u16::from(r.code), r.description.clone().unwrap_or_default())
}

/// A WebSocket client on a plain blocking socket that does the upgrade by
/// hand and then reads only when told to: a device that never reads, whose
/// TCP buffers fill up (and which never answers pings).
pub struct RawWs {
    stream: std::net::TcpStream,
    buf: Vec<u8>,
}

/// One frame from the relay.
#[derive(Debug)]
pub enum RawFrame {
    Text(Value),
    Ping,
    Pong,
    Close(u16, String),
    /// A binary message (its bytes are not kept).
    Binary,
}

impl RawWs {
    /// Upgrades `GET /v1/ws` (with `token` in the `Authorization` header if
    /// given). `rcvbuf`: a receive buffer size fixed before connecting, so
    /// the kernel cannot absorb much for a reader that does not read.
    /// A refused upgrade is its HTTP status.
    pub fn connect(base: &str, token: Option<&str>, rcvbuf: Option<usize>) -> Result<RawWs, u16> {
        use std::io::Write;
        let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse().expect("relay address");
        let mut stream = match rcvbuf {
            None => std::net::TcpStream::connect(addr).expect("connect"),
            Some(n) => connect_with_rcvbuf(addr, n),
        };
        stream.set_nodelay(true).unwrap();
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let head = format!(
            "GET /v1/ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n{auth}\r\n"
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.set_read_timeout(Some(WAIT)).unwrap();
        let mut buf = Vec::new();
        let (head, end) = loop {
            if let Some(parsed) = super::http::parse_head(&buf) {
                break parsed;
            }
            super::http::read_more(&mut stream, &mut buf).expect("the upgrade response");
        };
        let status = head.status().expect("status line");
        if status != 101 {
            return Err(status);
        }
        buf.drain(..end);
        Ok(RawWs { stream, buf })
    }

    /// Sends a (masked) text frame.
    pub fn send_text(&mut self, text: &str) {
        use std::io::Write;
        self.stream.write_all(&client_frame(0x1, text.as_bytes())).expect("send frame");
    }

    /// The next frame within `wait`, or None (timeout or end of stream).
    pub fn frame(&mut self, wait: std::time::Duration) -> Option<RawFrame> {
        use std::io::Read;
        let deadline = std::time::Instant::now() + wait;
        let mut message: Vec<u8> = Vec::new();
        let mut message_op = 0;
        loop {
            while let Some((fin, op, payload, used)) = parse_frame(&self.buf) {
                self.buf.drain(..used);
                match op {
                    0x0 => message.extend_from_slice(&payload),
                    0x1 | 0x2 => {
                        message_op = op;
                        message = payload;
                    }
                    0x8 => {
                        let code = if payload.len() >= 2 { u16::from_be_bytes([payload[0], payload[1]]) } else { 1005 };
                        let reason = String::from_utf8_lossy(payload.get(2..).unwrap_or_default()).into_owned();
                        return Some(RawFrame::Close(code, reason));
                    }
                    0x9 => return Some(RawFrame::Ping),
                    0xA => return Some(RawFrame::Pong),
                    _ => panic!("unknown opcode {op}"),
                }
                if fin && matches!(op, 0x0..=0x2) {
                    return Some(match message_op {
                        0x1 => RawFrame::Text(serde_json::from_slice(&message).expect("JSON text frame")),
                        _ => RawFrame::Binary,
                    });
                }
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return None;
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            let mut chunk = vec![0u8; 1 << 16];
            match self.stream.read(&mut chunk) {
                Ok(0) => return None,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return None
                }
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// Whether the relay still holds this connection (its side is in the
    /// kernel's TCP table, `/proc/net/tcp`): seen without reading. A relay
    /// that gives up on a client that does not read sends nothing, so only
    /// the relay's side shows it.
    pub fn relay_holds_it(&self) -> bool {
        let (mine, relay) = (self.stream.local_addr().unwrap(), self.stream.peer_addr().unwrap());
        let hex = |a: std::net::SocketAddr| {
            let std::net::SocketAddr::V4(v4) = a else { panic!("IPv4 loopback expected") };
            format!("{:08X}:{:04X}", u32::from_le_bytes(v4.ip().octets()), v4.port())
        };
        let (local, remote) = (hex(relay), hex(mine));
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        table.lines().skip(1).any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[1] == local && f[2] == remote
        })
    }

    /// Reads at most `n` bytes (within `wait`) and discards them: a reader at
    /// a crawl. Ok(0) is the end of the stream; a reset is an error.
    pub fn read_discard(&mut self, n: usize, wait: std::time::Duration) -> std::io::Result<usize> {
        use std::io::Read;
        self.buf.clear();
        self.stream.set_read_timeout(Some(wait)).unwrap();
        let mut chunk = vec![0u8; n];
        self.stream.read(&mut chunk)
    }

    /// Reads everything until the relay's close frame (bounded by `wait`):
    /// the text frames before it, and the close code and reason.
    pub fn drain(&mut self, wait: std::time::Duration) -> (Vec<Value>, Option<(u16, String)>) {
        let deadline = std::time::Instant::now() + wait;
        let mut texts = vec![];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.frame(left) {
                Some(RawFrame::Text(v)) => texts.push(v),
                Some(RawFrame::Close(code, reason)) => return (texts, Some((code, reason))),
                Some(_) => {}
                None => return (texts, None),
            }
        }
    }
}

/// A TCP connection whose receive buffer is fixed at `rcvbuf` bytes before
/// the handshake (so the advertised window stays small).
fn connect_with_rcvbuf(addr: std::net::SocketAddr, rcvbuf: usize) -> std::net::TcpStream {
    use std::os::fd::FromRawFd;
    let std::net::SocketAddr::V4(v4) = addr else { panic!("IPv4 loopback expected") };
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let size = rcvbuf as libc::c_int;
        let r = libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            &size as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "SO_RCVBUF: {}", std::io::Error::last_os_error());
        let sa = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: v4.port().to_be(),
            sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(v4.ip().octets()) },
            sin_zero: [0; 8],
        };
        let r = libc::connect(
            fd,
            &sa as *const libc::sockaddr_in as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        );
        assert_eq!(r, 0, "connect: {}", std::io::Error::last_os_error());
        std::net::TcpStream::from_raw_fd(fd)
    }
}
