//! The process manager of `message.send`, carried out: its rules (which
//! command goes to whom, in which order, and what a `StateConflict` at
//! the recipient means) are [`relay_core::send`]; this drives them with
//! the actors, the route lookup and the store.
//!
//! **Recipient served by this relay alone** (two commits): the sender's
//! account decides and writes nothing; the recipient's account takes the
//! receipt (commit 1); the sender's account writes the acceptance and its
//! final status together (commit 2), and the client is answered once
//! commit 2 is durable, which covers commit 1 (one writer, groups durable
//! in commit order). No delivery stream, due entry or delivery actor. A
//! crash between the two leaves a receipt without an acceptance: the
//! client, never answered, retries with the same params; the recipient
//! answers the duplicate with its original result and the sender settles
//! then. If the local attempt does not end at once (the recipient's actor
//! busy, a retryable or route error), the acceptance is written with a
//! delivery stream and the timetable takes over, as for any other relay.
//!
//! **Recipient elsewhere** (two commits when the first attempt ends it):
//! the acceptance carries the delivery stream, its due entry and, when the
//! route is known, the first attempt; the delivery actor starts from it in
//! memory, sends once it is durable, and writes the outcome, the sender's
//! status and ledger entry and the due-index removal as one commit.

use crate::account::{AccountCmd, Reply};
use crate::delivery;
use crate::supervisor::Supervisor;
use relay_core::delivery::outcome::AttemptOutcome;
use relay_core::send::{Input, Next, SendProcess};
use relay_schemas::methods::SendParams;
use relay_schemas::objects::RelayRef;
use relay_schemas::{DeliveryStatus, RelayError};
use tokio::sync::oneshot;

/// A `message.send` answered by the sender's account.
#[derive(Debug)]
pub struct Sent {
    /// The status as written.
    pub status: DeliveryStatus,
    /// For a delivery left running: its status after its first attempt.
    pub first_attempt: Option<oneshot::Receiver<DeliveryStatus>>,
}

impl Supervisor {
    /// `message.send` by `device` of `account` (from the session). Refused
    /// only when the peers' answers prove that no relay serves the
    /// recipient; when some peer could not be asked, the message is
    /// accepted and its route resolved at every attempt (PROTOCOL §4).
    pub async fn message_send(
        &self,
        account: &str,
        device: String,
        params: SendParams,
        digest: String,
    ) -> Result<Sent, RelayError> {
        // Detached from the caller: a caller that goes away (a closed
        // socket, a timeout) must neither stop the send between its commits
        // nor leave an accepted delivery unstarted.
        let (sup, account) = (self.clone(), account.to_owned());
        let (tx, rx) = oneshot::channel();
        actix::spawn(async move {
            let _ = tx.send(sup.run_send(&account, device, params, digest).await);
        });
        rx.await.unwrap_or_else(|_| Err(RelayError::unavailable("message.send interrupted")))
    }

    /// Carries out each step [`SendProcess`] decides and feeds back what
    /// came of it.
    async fn run_send(
        &self,
        account: &str,
        device: String,
        params: SendParams,
        digest: String,
    ) -> Result<Sent, RelayError> {
        let (mut process, mut next) = SendProcess::start(account, device, params, digest)?;
        loop {
            let input = match next {
                Next::LookupRoute => {
                    let lookup = self.lookup_route(process.to(), false).await;
                    lookup.check_send(process.to())?;
                    Input::Routed(lookup.route())
                }
                Next::AskSender(cmd) => Input::Replied(self.ask(account, cmd).await?),
                Next::Receive(receipt) => {
                    let outcome = self.receive(process.to(), receipt).await;
                    crate::crash::point("send.after_receipt", || self.store().durable(self.store().committed())).await;
                    delivery::count_attempt(self.metrics(), &outcome);
                    Input::Received(outcome)
                }
                Next::RefuseWhenDurable(e) => {
                    let store = self.store();
                    store.durable(store.committed()).await.map_err(|e| crate::shell::internal(&e))?;
                    return Err(e);
                }
                Next::Answer { reply, finished } => {
                    if let (Some(f), Reply::Settled { status, .. }) = (finished, &reply) {
                        let ids = delivery::Ids { from: &f.from, message_id: &f.message_id, to: &f.to };
                        let elapsed_s = self.clock().now().since(f.accepted_at);
                        delivery::finished(self.metrics(), ids, &self.policy().relay_id, 1, elapsed_s, status);
                    }
                    return self.sent(reply);
                }
            };
            next = process.on(input)?;
        }
    }

    /// The recipient's receipt of a message this relay serves it: its
    /// account's actor, or, for an account of another shard of this relay,
    /// that shard's owner (the receipt is then its own commit, in its own
    /// stream, made before the acceptance here, as locally).
    pub(crate) async fn receive(&self, to: &str, receipt: AccountCmd) -> AttemptOutcome {
        if self.transport().in_sibling_shard(to) {
            let AccountCmd::MessageDeliver { params, .. } = receipt else {
                return AttemptOutcome::NotAttempted(RelayError::internal("a receipt must be a delivery"));
            };
            let own = RelayRef { id: self.policy().relay_id.to_string(), url: String::new() };
            return self.transport().deliver(&own, &params).await;
        }
        match self.ask_at_once(to, receipt).await {
            Ok(Reply::Status(status)) => AttemptOutcome::Answered(status),
            Ok(other) => AttemptOutcome::Unknown(RelayError::internal(format!("unexpected reply {other:?}"))),
            Err(e) => AttemptOutcome::Rejected(e),
        }
    }

    /// Carries out what the sender's account answered: a delivery to start
    /// now (its first attempt is in flight) or at its next due time.
    fn sent(&self, reply: Reply) -> Result<Sent, RelayError> {
        match reply {
            Reply::Status(status) | Reply::Settled { status, .. } => Ok(Sent { status, first_attempt: None }),
            Reply::Accepted { status, start } if start.state.in_flight.is_some() => {
                let (tx, rx) = oneshot::channel();
                self.resume_delivery(*start, tx);
                Ok(Sent { status, first_attempt: Some(rx) })
            }
            Reply::Accepted { status, start } => {
                self.schedule(start.stream, start.indexed_due_ms);
                Ok(Sent { status, first_attempt: None })
            }
            other => Err(RelayError::internal(format!("unexpected reply to message.send: {other:?}"))),
        }
    }
}
