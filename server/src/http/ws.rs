//! `GET /v1/ws`: the client WebSocket (PROTOCOL §3). JSON text frames:
//! requests `{"id","method","params"}` answered `{"id","result"}` or
//! `{"id","error"}`, and notifications `{"method","params"}` pushed by the
//! relay. A connection authenticates with the `Authorization` header at
//! upgrade or with a `session.attach {"token"}` frame; every client method
//! is then callable with its `id`.
//!
//! One task per connection. It reads frames while a request runs (so pongs
//! and closes are seen whatever else is going on), queues requests and runs
//! them one after the other (answers keep request order), writes the
//! notifications queued for it by [`relay_actors::notify::Notifier`] (in
//! their order), pings, and closes the socket on idle timeout, session
//! expiry, device revocation, no session attached within
//! `websocket.attach_timeout`, or slow consumption, with the reason in the
//! close frame. At most `websocket.max_requests_in_flight` requests (and
//! `max_unread_bytes` of them) wait: a full queue pauses reading, so TCP
//! holds back a client that pipelines more; only while the byte budget
//! below is used up must frames still be read (for the pong), and one more
//! request then closes the socket.
//!
//! Memory per connection is bounded whatever the client does: every write
//! must be taken within `websocket.write_timeout`, and the bytes written and
//! not yet proven read are kept under `websocket.max_unread_bytes` by flow
//! pings (see [`relay_core::flow`]). While that budget is exhausted the
//! connection starts no request and takes no notification; a client that
//! does not answer the flow ping within `write_timeout` is a slow consumer.
//! `idle_timeout` runs on its own timer and also bounds every write, so it
//! holds whatever the write side is doing. The close is bounded too: a
//! client that neither answers the close nor takes every byte sent within
//! `write_timeout` (one reading at a crawl) has its socket aborted, which
//! frees what actix-http and the kernel still hold for it; one that reads
//! nothing at all is also given up by the kernel (`TCP_USER_TIMEOUT`).

use super::client_addr::{client_ip, TrustedProxies};
use super::reply::{bearer, error_response, over_cap};
use crate::app::App;
use crate::config::Websocket;
use actix_web::rt::time::timeout;
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use actix_ws::{AggregatedMessage, CloseCode, CloseReason, Session};
use futures_util::future::LocalBoxFuture;
use relay_actors::account::{AccountCmd, Reply};
use relay_actors::notify::{Announced, Attached, Push};
use relay_actors::sessions;
use relay_core::flow::{self, Flow};
use relay_schemas::{RelayError, UnixSecs};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::time::timeout_at;

#[derive(Deserialize)]
struct Request<'a> {
    #[serde(default)]
    id: Value,
    method: String,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

/// Close codes in the private range, with a readable reason.
const SESSION_ENDED: u16 = 4001;
const SLOW_OR_REVOKED: u16 = 4002;
/// RFC 6455 policy violation: a limit of this relay.
const POLICY: u16 = 1008;
const SLOW_CONSUMER: &str = "slow consumer: reconnect and sync from your cursor";

fn close(code: u16, reason: &str) -> Option<CloseReason> {
    Some(CloseReason { code: CloseCode::Other(code), description: Some(reason.to_owned()) })
}

/// An authenticated connection: its token, session and notification queue.
struct Attachment {
    token: String,
    session: sessions::Session,
    attached: Attached,
    announced: Announced,
}

/// Open WebSockets per client behind a trusted proxy, whose connections
/// the per-IP connection count leaves out (`super::conn`).
#[derive(Clone)]
pub struct ProxiedWebsockets(pub super::conn::PerIp);

/// A WebSocket's place in the count of `client`'s, when it came through a
/// trusted proxy; refused past `http.max_connections_per_ip`.
fn proxied_slot(req: &HttpRequest, client: Option<IpAddr>) -> Result<Option<super::conn::Slot>, RelayError> {
    let (Some(peer), Some(client), Some(proxies), Some(counts)) =
        (req.peer_addr(), client, req.app_data::<TrustedProxies>(), req.app_data::<ProxiedWebsockets>())
    else {
        return Ok(None);
    };
    if !proxies.trusts(peer.ip()) {
        return Ok(None);
    }
    let slot = counts.0.open(client);
    if slot.within {
        Ok(Some(slot))
    } else {
        Err(over_cap())
    }
}

pub async fn upgrade(
    relay: web::Data<App>,
    ws: web::Data<Websocket>,
    req: HttpRequest,
    body: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    let ip = client_ip(&req);
    let slot = match proxied_slot(&req, ip) {
        Ok(slot) => slot,
        Err(e) => return Ok(error_response(&e)),
    };
    // A header that is present must be good: refuse the upgrade otherwise.
    let attach = match bearer(&req) {
        Some(token) => match check_token(&relay, token).await {
            Ok(s) => Some((token.to_owned(), s)),
            Err(e) => return Ok(error_response(&e)),
        },
        None => None,
    };
    let socket = req.conn_data::<super::conn::Socket>().copied();
    if let Some(socket) = socket {
        socket.set_user_timeout(ws.write_timeout);
    }
    let (response, session, stream) = actix_ws::handle(&req, body)?;
    let stream =
        stream.max_frame_size(ws.max_frame_bytes).aggregate_continuations().max_continuation_size(ws.max_frame_bytes);
    let conn = Connection::new(relay.into_inner(), ws.get_ref().clone(), session, ip, slot, socket);
    actix_web::rt::spawn(conn.run(stream, attach));
    Ok(response)
}

/// A live session whose device is still valid (not revoked or expired).
async fn check_token(relay: &App, token: &str) -> Result<sessions::Session, RelayError> {
    let sup = relay.supervisor();
    let session = sup
        .sessions()
        .lookup(token, sup.clock().now())
        .ok_or_else(|| RelayError::unauthorized("unknown or expired session"))?;
    sup.ask(&session.account_id, AccountCmd::CheckSession { device: session.device_id.clone() }).await?;
    Ok(session)
}

/// Registers a session's device for notifications, then asks for its
/// backlog: the latest record beyond its ack cursor, if any. In this order,
/// so a record appended in between is notified or in the backlog.
async fn register(relay: &App, session: &sessions::Session) -> (Attached, Option<u64>) {
    let sup = relay.supervisor();
    let attached = sup.notifier().attach(&session.account_id, &session.device_id);
    let backlog = sup.ask(&session.account_id, AccountCmd::Backlog { device: session.device_id.clone() }).await;
    let latest = match backlog {
        Ok(Reply::Backlog(latest)) => latest,
        _ => None,
    };
    (attached, latest)
}

/// A request that finished running.
enum Done {
    Answer(Value, Result<String, RelayError>),
    Attached { id: Value, token: String, session: sessions::Session, attached: Attached, latest: Option<u64> },
}

struct Connection {
    relay: Arc<App>,
    ws: Websocket,
    session: Session,
    attachment: Option<Attachment>,
    /// The client's address (session-less methods are limited per address).
    ip: Option<IpAddr>,
    flow: Flow,
    /// Requests read and not started yet, in arrival order, and their bytes.
    queued: VecDeque<Bytes>,
    queued_bytes: usize,
    /// The request being answered (one at a time: answers keep request order).
    running: Option<LocalBoxFuture<'static, Done>>,
    /// When the client was last heard from (or reading was paused).
    last_heard: Instant,
    /// The socket, to drop a connection that does not take its close.
    socket: Option<super::conn::Socket>,
    /// The client sent its Close (the close handshake is its answer).
    client_closed: bool,
    /// Its place in the count of its client's WebSockets (behind a proxy),
    /// held until the connection ends.
    _slot: Option<super::conn::Slot>,
}

enum Next {
    Continue,
    Close(Option<CloseReason>),
}

impl Connection {
    fn new(
        relay: Arc<App>,
        ws: Websocket,
        session: Session,
        ip: Option<IpAddr>,
        slot: Option<super::conn::Slot>,
        socket: Option<super::conn::Socket>,
    ) -> Self {
        let flow = Flow::new(ws.max_unread_bytes as u64);
        Connection {
            relay,
            ws,
            session,
            attachment: None,
            ip,
            flow,
            queued: VecDeque::new(),
            queued_bytes: 0,
            running: None,
            last_heard: Instant::now(),
            socket,
            client_closed: false,
            _slot: slot,
        }
    }

    async fn run(mut self, mut stream: actix_ws::AggregatedMessageStream, attach: Option<(String, sessions::Session)>) {
        let _open = crate::observe::Held::new(&self.relay.supervisor().metrics().websocket_connections);
        let mut next = Next::Continue;
        if let Some((token, session)) = attach {
            let (attached, latest) = register(&self.relay, &session).await;
            next = self.attached(token, session, attached, latest).await;
        }
        let mut ping = actix_web::rt::time::interval(self.ws.ping_interval);
        ping.tick().await;
        self.last_heard = Instant::now();
        let attach_by = Instant::now() + self.ws.attach_timeout;
        let reason = loop {
            if let Next::Close(reason) = next {
                break reason;
            }
            // The next request starts once the previous one is answered and
            // the client has read enough of what it was sent.
            if self.running.is_none() && self.flow.open() {
                if let Some(text) = self.queued.pop_front() {
                    self.queued_bytes -= text.len();
                    self.running = Some(self.start(text));
                }
            }
            // A full queue pauses reading (TCP holds the rest), except while
            // the budget is used up: the pong that reopens it must be read.
            let reading = !self.flow.open() || self.room().is_ok();
            if !reading {
                // Silence we do not listen to is not idleness.
                self.last_heard = Instant::now();
            }
            let idle_at = self.last_heard + self.ws.idle_timeout;
            let open = self.flow.open();
            let expiry = self.session_expiry();
            let unattached = self.attachment.is_none().then_some(attach_by);
            let stalled = self.flow.deadline(self.ws.write_timeout);
            next = tokio::select! {
                frame = stream.recv(), if reading => {
                    self.last_heard = Instant::now();
                    match frame {
                        Some(Ok(AggregatedMessage::Text(text))) => self.read_request(text.into_bytes()),
                        Some(Ok(AggregatedMessage::Binary(_))) => Next::Close(close(1003, "binary frames are not part of the protocol")),
                        Some(Ok(AggregatedMessage::Ping(b))) => self.control(false, &b).await,
                        Some(Ok(AggregatedMessage::Pong(b))) => {
                            self.flow.pong(&b, Instant::now());
                            self.probe().await
                        }
                        Some(Ok(AggregatedMessage::Close(_))) => {
                            self.client_closed = true;
                            Next::Close(None)
                        }
                        None => Next::Close(None),
                        Some(Err(e)) => Next::Close(close(1009, &format!("bad frame: {e}"))),
                    }
                }
                done = Self::running(&mut self.running) => {
                    self.running = None;
                    self.finish(done).await
                }
                push = Self::next_push(&mut self.attachment), if open => match push {
                    Some(push) => self.push(push).await,
                    None => Next::Close(close(SLOW_OR_REVOKED, SLOW_CONSUMER)),
                },
                _ = ping.tick() => self.control(true, b"").await,
                // On a timer of its own (and bounding every write, see
                // `write_by`): the idle rule holds whatever the writes do.
                _ = sleep_until(Some(idle_at)) => Next::Close(close(1001, "idle timeout")),
                _ = sleep_until(expiry) => Next::Close(close(SESSION_ENDED, "session expired")),
                _ = sleep_until(unattached) => {
                    Next::Close(close(POLICY, "no session attached within websocket.attach_timeout"))
                }
                _ = sleep_until(stalled) => Next::Close(close(SLOW_OR_REVOKED, SLOW_CONSUMER)),
            };
        };
        if let Some(a) = self.attachment.take() {
            self.relay.supervisor().notifier().detach(&a.session.account_id, a.attached.id);
        }
        self.shut(stream, reason).await;
    }

    /// The close: the close frame, then the client's answer, both within
    /// `write_timeout`. The close frame waits behind whatever the client has
    /// not read yet (in actix-ws's channel, actix-http's buffer, the
    /// kernel's), and a client reading at a crawl could keep all of it, and
    /// its socket, for ever after this task ended. So unless the client
    /// answers the close (its Close frame, or its side of the connection
    /// closed) or has taken every byte by then, the connection is dropped:
    /// what is queued for it is discarded and the socket freed.
    async fn shut(self, mut stream: actix_ws::AggregatedMessageStream, reason: Option<CloseReason>) {
        use futures_util::FutureExt;
        let deadline = Instant::now() + self.ws.write_timeout;
        let mut answered = self.client_closed;
        // While the stream has not ended, the response body lives, so
        // actix-http still holds the socket: take a descriptor of our own
        // now, as the close frame can end the body before the bytes leave.
        // (No await between the look and the dup: no other task runs.)
        // Only a stream with nothing ready proves it: frames read before
        // the body ended are still handed out.
        let mut ended = false;
        while !answered {
            match stream.recv().now_or_never() {
                None => break,
                Some(None | Some(Err(_))) => {
                    ended = true;
                    break;
                }
                Some(Some(Ok(AggregatedMessage::Close(_)))) => answered = true,
                Some(Some(Ok(_))) => {}
            }
        }
        let held = if ended || answered { None } else { self.socket.and_then(|s| s.hold()) };
        let _ = timeout_at(deadline.into(), self.session.close(reason)).await;
        let Some(held) = held else { return };
        // Frames after our Close are not taken (RFC 6455 §5.5.1), only its answer.
        let look = Duration::from_millis(20);
        while !(answered || (ended && held.settled())) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                held.abort();
                return;
            }
            if ended {
                actix_web::rt::time::sleep(left.min(look)).await;
                continue;
            }
            match timeout(left.min(look), stream.recv()).await {
                Ok(Some(Ok(AggregatedMessage::Close(_)))) => answered = true,
                Ok(None) => ended = true,
                Ok(Some(_)) | Err(_) => {}
            }
        }
    }

    async fn running(running: &mut Option<LocalBoxFuture<'static, Done>>) -> Done {
        match running {
            Some(f) => f.as_mut().await,
            None => std::future::pending().await,
        }
    }

    async fn next_push(attachment: &mut Option<Attachment>) -> Option<Push> {
        match attachment {
            Some(a) => a.attached.rx.recv().await,
            None => std::future::pending().await,
        }
    }

    /// When the attached session expires (never while unattached).
    fn session_expiry(&self) -> Option<Instant> {
        let a = self.attachment.as_ref()?;
        let left = UnixSecs(a.session.expires_at).since(self.relay.supervisor().clock().now());
        Some(Instant::now() + Duration::from_secs(left))
    }

    /// Whether another request may be read ([`flow::request_room`]); `Err`:
    /// which bound is reached.
    fn room(&self) -> Result<(), String> {
        let in_flight = self.queued.len() + usize::from(self.running.is_some());
        flow::request_room(in_flight, self.queued_bytes, self.ws.max_requests_in_flight, self.ws.max_unread_bytes)
    }

    /// Queues a request frame. One read while the budget is used up and the
    /// queue is full (a client that sends and does not read) closes the socket.
    fn read_request(&mut self, text: Bytes) -> Next {
        if let Err(reason) = self.room() {
            return Next::Close(close(POLICY, &reason));
        }
        self.queued_bytes += text.len();
        self.queued.push_back(text);
        Next::Continue
    }

    /// The future answering one request frame; it owns what it needs, so it
    /// runs while the connection goes on reading frames and pinging.
    fn start(&self, text: Bytes) -> LocalBoxFuture<'static, Done> {
        let (relay, ip) = (self.relay.clone(), self.ip);
        let token = self.attachment.as_ref().map(|a| a.token.clone());
        Box::pin(async move {
            let req: Request = match serde_json::from_slice(&text) {
                Ok(r) => r,
                Err(e) => return Done::Answer(Value::Null, Err(RelayError::invalid_params(format!("frame: {e}")))),
            };
            let params = req.params.map_or("{}", RawValue::get);
            if req.method != "session.attach" {
                let result = crate::rpc::call(&relay, &req.method, token.as_deref(), ip, params.as_bytes()).await;
                return Done::Answer(req.id, result);
            }
            #[derive(Deserialize)]
            struct Attach {
                token: String,
            }
            let attach = async {
                let p: Attach = crate::app::parse(params.as_bytes())?;
                if token.is_some() {
                    return Err(RelayError::invalid_state("this connection is already attached to a session"));
                }
                let session = check_token(&relay, &p.token).await?;
                Ok((p.token, session))
            };
            match attach.await {
                Ok((token, session)) => {
                    let (attached, latest) = register(&relay, &session).await;
                    Done::Attached { id: req.id, token, session, attached, latest }
                }
                Err(e) => Done::Answer(req.id, Err(e)),
            }
        })
    }

    async fn finish(&mut self, done: Done) -> Next {
        match done {
            Done::Answer(id, result) => {
                let frame = match result {
                    Ok(json) => format!("{{\"id\":{id},\"result\":{json}}}"),
                    Err(e) => json!({ "id": id, "error": e }).to_string(),
                };
                self.text(frame).await
            }
            Done::Attached { id, token, session, attached, latest } => {
                match self.attached(token, session, attached, latest).await {
                    Next::Continue => self.text(format!("{{\"id\":{id},\"result\":{{}}}}")).await,
                    close => close,
                }
            }
        }
    }

    /// The connection is attached: tells the device of its backlog, if any.
    async fn attached(
        &mut self,
        token: String,
        session: sessions::Session,
        attached: Attached,
        latest: Option<u64>,
    ) -> Next {
        let backlog = latest.map(|l| Push::timeline_changed(&session.account_id, l));
        self.attachment = Some(Attachment { token, session, attached, announced: Announced::default() });
        match backlog {
            Some(push) => self.push(push).await,
            None => Next::Continue,
        }
    }

    /// Carries out a push: a notification the device has not had yet is
    /// written, a close closes.
    async fn push(&mut self, push: Push) -> Next {
        let news = self.attachment.as_mut().is_some_and(|a| a.announced.news(&push));
        match push {
            Push::Close { reason } => Next::Close(close(SLOW_OR_REVOKED, &reason)),
            Push::Notify { method, params } if news => {
                self.text(json!({ "method": method, "params": params }).to_string()).await
            }
            Push::Notify { .. } => Next::Continue,
        }
    }

    /// Writes a text frame (within `write_timeout`), counts it against the
    /// budget, and sends a flow ping when one is due.
    async fn text(&mut self, frame: String) -> Next {
        let bytes = frame.len();
        let (by, idle) = self.write_by();
        match timeout_at(by.into(), self.session.text(frame)).await {
            Ok(Ok(())) => self.flow.wrote(bytes, Instant::now()),
            Ok(Err(_)) => return Next::Close(None),
            Err(_) => return Next::Close(Self::late(idle)),
        }
        self.probe().await
    }

    /// When a write must have been taken ([`flow::write_by`]; true: the
    /// idle deadline comes first).
    fn write_by(&self) -> (Instant, bool) {
        flow::write_by(self.last_heard, self.ws.idle_timeout, Instant::now(), self.ws.write_timeout)
    }

    /// The close reason of a write not taken by [`Self::write_by`].
    fn late(idle: bool) -> Option<CloseReason> {
        if idle {
            close(1001, "idle timeout")
        } else {
            close(SLOW_OR_REVOKED, SLOW_CONSUMER)
        }
    }

    async fn probe(&mut self) -> Next {
        match self.flow.probe() {
            Some(payload) => self.control(true, &payload).await,
            None => Next::Continue,
        }
    }

    /// A ping (or the pong answering the client's ping), within `write_timeout`.
    async fn control(&mut self, ping: bool, payload: &[u8]) -> Next {
        let (by, idle) = self.write_by();
        let write = async {
            if ping {
                self.session.ping(payload).await
            } else {
                self.session.pong(payload).await
            }
        };
        match timeout_at(by.into(), write).await {
            Ok(Ok(())) => Next::Continue,
            Ok(Err(_)) => Next::Close(None),
            Err(_) => Next::Close(Self::late(idle)),
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => actix_web::rt::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
