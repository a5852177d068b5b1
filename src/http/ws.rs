//! `GET /v1/ws`: the client WebSocket (PROTOCOL §3). JSON text frames:
//! requests `{"id","method","params"}` answered `{"id","result"}` or
//! `{"id","error"}`, and notifications `{"method","params"}` pushed by the
//! relay. A connection authenticates with the `Authorization` header at
//! upgrade or with a first `session.attach {"token"}` frame; every client
//! method is then callable with its `id`.
//!
//! One task per connection: it reads frames, runs requests one after the
//! other (answers keep request order), writes the notifications queued for
//! it by [`relay_actors::notify::Notifier`], pings, and closes the socket on
//! idle timeout, session expiry, device revocation or slow consumption, with
//! the reason in the close frame.

use super::{bearer, error_response};
use crate::config::Websocket;
use crate::rpc::Relay;
use actix_web::{web, HttpRequest, HttpResponse};
use actix_ws::{AggregatedMessage, CloseCode, CloseReason, Session};
use relay_actors::account::{AccountCmd, Reply};
use relay_actors::notify::{Attached, Push};
use relay_actors::sessions;
use relay_schemas::RelayError;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

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

fn close(code: u16, reason: &str) -> Option<CloseReason> {
    Some(CloseReason { code: CloseCode::Other(code), description: Some(reason.to_owned()) })
}

/// An authenticated connection: its token, session and notification queue.
struct Attachment {
    token: String,
    session: sessions::Session,
    attached: Attached,
}

pub async fn upgrade(
    relay: web::Data<Relay>,
    ws: web::Data<Websocket>,
    req: HttpRequest,
    body: web::Payload,
) -> Result<HttpResponse, actix_web::Error> {
    // A header that is present must be good: refuse the upgrade otherwise.
    let attach = match bearer(&req) {
        Some(token) => match check_token(&relay, token).await {
            Ok(s) => Some((token.to_owned(), s)),
            Err(e) => return Ok(error_response(&e)),
        },
        None => None,
    };
    let (response, session, stream) = actix_ws::handle(&req, body)?;
    let stream =
        stream.max_frame_size(ws.max_frame_bytes).aggregate_continuations().max_continuation_size(ws.max_frame_bytes);
    let ip = req.peer_addr().map(|a| a.ip());
    actix_web::rt::spawn(
        Connection { relay: relay.into_inner(), ws: ws.get_ref().clone(), session, attachment: None, ip }
            .run(stream, attach),
    );
    Ok(response)
}

/// A live session whose device is still valid (not revoked or expired).
async fn check_token(relay: &Relay, token: &str) -> Result<sessions::Session, RelayError> {
    let sup = relay.supervisor();
    let session = sup
        .sessions()
        .lookup(token, sup.clock().now())
        .ok_or_else(|| RelayError::unauthorized("unknown or expired session"))?;
    sup.ask(&session.account_id, AccountCmd::CheckSession { device: session.device_id.clone() }).await?;
    Ok(session)
}

struct Connection {
    relay: Arc<Relay>,
    ws: Websocket,
    session: Session,
    attachment: Option<Attachment>,
    /// The client's address (session-less methods are limited per address).
    ip: Option<std::net::IpAddr>,
}

enum Next {
    Continue,
    Close(Option<CloseReason>),
}

impl Connection {
    async fn run(mut self, mut stream: actix_ws::AggregatedMessageStream, attach: Option<(String, sessions::Session)>) {
        if let Some((token, s)) = attach {
            self.attach(token, s).await;
        }
        let mut ping = actix_web::rt::time::interval(self.ws.ping_interval);
        ping.tick().await;
        let mut last_heard = Instant::now();
        let reason = loop {
            let expiry = self.session_expiry();
            let next = tokio::select! {
                frame = stream.recv() => {
                    last_heard = Instant::now();
                    match frame {
                        Some(Ok(AggregatedMessage::Text(text))) => self.on_text(&text).await,
                        Some(Ok(AggregatedMessage::Binary(_))) => Next::Close(close(1003, "binary frames are not part of the protocol")),
                        Some(Ok(AggregatedMessage::Ping(b))) => match self.session.pong(&b).await {
                            Ok(()) => Next::Continue,
                            Err(_) => Next::Close(None),
                        },
                        Some(Ok(AggregatedMessage::Pong(_))) => Next::Continue,
                        Some(Ok(AggregatedMessage::Close(_))) | None => Next::Close(None),
                        Some(Err(e)) => Next::Close(close(1009, &format!("bad frame: {e}"))),
                    }
                }
                push = Self::next_push(&mut self.attachment) => match push {
                    Some(Push::Notify { method, params }) => {
                        let frame = json!({ "method": method, "params": params }).to_string();
                        match self.session.text(frame).await {
                            Ok(()) => Next::Continue,
                            Err(_) => Next::Close(None),
                        }
                    }
                    Some(Push::Close { reason }) => Next::Close(close(SLOW_OR_REVOKED, &reason)),
                    None => Next::Close(close(SLOW_OR_REVOKED, "slow consumer: reconnect and sync from your cursor")),
                },
                _ = ping.tick() => {
                    if last_heard.elapsed() >= self.ws.idle_timeout {
                        Next::Close(close(1001, "idle timeout"))
                    } else if self.session.ping(b"").await.is_err() {
                        Next::Close(None)
                    } else {
                        Next::Continue
                    }
                }
                _ = sleep_until(expiry) => Next::Close(close(SESSION_ENDED, "session expired")),
            };
            if let Next::Close(reason) = next {
                break reason;
            }
        };
        if let Some(a) = self.attachment.take() {
            self.relay.supervisor().notifier().detach(&a.session.account_id, a.attached.id);
        }
        let _ = self.session.close(reason).await;
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
        let left = a.session.expires_at.saturating_sub(self.relay.supervisor().clock().now());
        Some(Instant::now() + Duration::from_secs(left))
    }

    /// Registers for notifications, then tells the device if it has records
    /// beyond its ack cursor to catch up on (its backlog).
    async fn attach(&mut self, token: String, session: sessions::Session) {
        let sup = self.relay.supervisor();
        let attached = sup.notifier().attach(&session.account_id, &session.device_id);
        let backlog = sup.ask(&session.account_id, AccountCmd::Backlog { device: session.device_id.clone() }).await;
        if let Ok(Reply::Json(j)) = backlog {
            if let Some(latest) = serde_json::from_str::<Value>(&j).ok().and_then(|v| v["latest"].as_u64()) {
                let push = Push::timeline_changed(&session.account_id, latest);
                if let Push::Notify { method, params } = push {
                    let _ = self.session.text(json!({ "method": method, "params": params }).to_string()).await;
                }
            }
        }
        self.attachment = Some(Attachment { token, session, attached });
    }

    async fn on_text(&mut self, text: &str) -> Next {
        let req: Request = match serde_json::from_str(text) {
            Ok(r) => r,
            Err(e) => return self.answer(&Value::Null, Err(RelayError::invalid_params(format!("frame: {e}")))).await,
        };
        let params = req.params.map_or("{}", RawValue::get);
        let result = if req.method == "session.attach" {
            self.session_attach(params).await
        } else {
            let token = self.attachment.as_ref().map(|a| a.token.clone());
            self.relay.call(&req.method, token.as_deref(), self.ip, params.as_bytes()).await
        };
        self.answer(&req.id, result).await
    }

    async fn session_attach(&mut self, params: &str) -> Result<String, RelayError> {
        #[derive(Deserialize)]
        struct Attach {
            token: String,
        }
        let p: Attach = crate::rpc::parse(params.as_bytes())?;
        if self.attachment.is_some() {
            return Err(RelayError::invalid_state("this connection is already attached to a session"));
        }
        let session = check_token(&self.relay, &p.token).await?;
        self.attach(p.token, session).await;
        Ok("{}".into())
    }

    async fn answer(&mut self, id: &Value, result: Result<String, RelayError>) -> Next {
        let frame = match result {
            Ok(json) => format!("{{\"id\":{id},\"result\":{json}}}"),
            Err(e) => json!({ "id": id, "error": e }).to_string(),
        };
        match self.session.text(frame).await {
            Ok(()) => Next::Continue,
            Err(_) => Next::Close(None),
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => actix_web::rt::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}
