//! The process manager of `message.send`: accept → receipt → settle, in
//! this one place. The actors only decide and write; the order of their
//! commits, and what happens between them, is here.
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
use crate::delivery::aggregate::final_status;
use crate::delivery::{self, AttemptOutcome};
use crate::supervisor::Supervisor;
use relay_schemas::methods::SendParams;
use relay_schemas::objects::RelayRef;
use relay_schemas::{DeliveryStatus, ErrorCode, RelayError, UnixSecs};
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

    async fn run_send(
        &self,
        account: &str,
        device: String,
        params: SendParams,
        digest: String,
    ) -> Result<Sent, RelayError> {
        let to = params.envelope.to.clone();
        relay_schemas::ids::check_account_id("envelope.to", &to)?;
        let route = if to == account {
            None
        } else {
            let lookup = self.lookup_route(&to, false).await;
            lookup.check_send(&to)?;
            lookup.route()
        };
        let cmd = AccountCmd::MessageSend { device, params, digest, route: route.clone() };
        let acceptance = match self.ask(account, cmd).await? {
            Reply::Accept(acceptance) => acceptance,
            other => return self.sent(other),
        };
        let receipt = AccountCmd::MessageDeliver {
            params: (*acceptance.deliver).clone(),
            digest: acceptance.deliver_digest.clone(),
        };
        let outcome = self.receive(&to, receipt).await;
        crate::crash::point(&self.store(), "send.after_receipt").await;
        delivery::count_attempt(self.metrics(), &outcome);
        // The recipient holds other deliver params under this message id: a
        // send of another content under the same id, racing this one, was
        // received first, or a retry after a crash differs from the original
        // (in content, or in the sender's route the params carry). Nothing
        // is written here, so this request is refused as the sender's ledger
        // would refuse it once the other settles: settling it as `failed`
        // could let it win the sender's ledger while the recipient holds the
        // other content. The refusal rests on the recipient's receipt, which
        // may not be durable yet: it is answered once it is.
        if let AttemptOutcome::Rejected(e) = &outcome {
            if e.code == ErrorCode::StateConflict {
                let store = self.store();
                store.durable(store.committed()).await.map_err(|e| crate::internal(&e))?;
                return Err(e.clone());
            }
        }
        let accepted_at = UnixSecs(acceptance.status.accepted_at);
        let env = acceptance.deliver.envelope.clone();
        let cmd = match final_status(&outcome, accepted_at) {
            Some(status) => AccountCmd::Settle { acceptance, status },
            // The attempt is recorded with the acceptance; the timetable
            // makes the next one.
            None => AccountCmd::Accept { acceptance, route, first: Some(outcome) },
        };
        let reply = self.ask(account, cmd).await?;
        if let Reply::Settled { status, .. } = &reply {
            // Written by this request (a racing retry answers `Status`).
            let ids = delivery::Ids { from: &env.from, message_id: &env.message_id, to: &env.to };
            let elapsed_s = self.clock().now().since(accepted_at);
            delivery::finished(self.metrics(), ids, &self.policy().relay_id, 1, elapsed_s, status);
        }
        self.sent(reply)
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
