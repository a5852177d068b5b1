//! The process manager of `message.send` as a pure state machine: which
//! command goes to whom next, given what the last one answered. The shell
//! (`relay-actors`' `send.rs`) only carries out each [`Next`] and feeds
//! back what came of it; the order of the commits and the rules between
//! them are here.
//!
//! 1. The recipient's route is looked up, unless the sender sends to its
//!    own account (self-delivery needs no route).
//! 2. The sender's account decides `MessageSend`. Anything but
//!    [`Reply::Accept`] (a duplicate, a self-delivery, an acceptance written
//!    with its delivery) is the answer.
//! 3. [`Reply::Accept`]: the recipient is served by this relay alone, so its
//!    account takes the receipt first (commit 1), answered at once.
//! 4. The sender's account writes the acceptance (commit 2): with the final
//!    status when the receipt ended the delivery (`Settle`), else with its
//!    delivery and that first attempt (`Accept`). The client is answered
//!    once commit 2 is durable, which covers commit 1.
//!
//! A receipt refused with `StateConflict` writes nothing at the sender: the
//! recipient holds other params under this message id, so the request is
//! refused as the sender's ledger would refuse it once the other send
//! settles, and only once the recipient's receipt is durable.

use crate::account::{Acceptance, AccountCmd, Reply, Written};
use crate::delivery::aggregate::final_status;
use crate::delivery::outcome::AttemptOutcome;
use relay_schemas::methods::SendParams;
use relay_schemas::objects::Route;
use relay_schemas::{ErrorCode, RelayError, UnixSecs, Wire};

/// One `message.send` between its commits.
#[derive(Debug)]
pub struct SendProcess {
    /// The recipient account.
    to: String,
    /// The recipient's route as looked up (`None`: self-delivery, or no
    /// route known yet).
    route: Option<Wire<Route>>,
    phase: Phase,
}

#[derive(Debug)]
enum Phase {
    /// Waiting for the recipient's route; the send is not yet decided.
    Routing {
        device: String,
        params: Box<SendParams>,
        digest: String,
    },
    /// Waiting for the sender's decision of `MessageSend`.
    Deciding,
    /// Waiting for the recipient's receipt of the decided acceptance.
    Receiving(Box<Acceptance>),
    /// Waiting for the sender's commit of the acceptance.
    Writing(Finished),
    Done,
}

/// What came of the last [`Next`].
#[derive(Debug)]
pub enum Input<W: Written> {
    /// The recipient's route (after [`Next::LookupRoute`]).
    Routed(Option<Wire<Route>>),
    /// The sender's account answered (after [`Next::AskSender`]).
    Replied(Reply<W>),
    /// The recipient's receipt came to this (after [`Next::Receive`]).
    Received(AttemptOutcome),
}

/// What the shell does next.
#[derive(Debug)]
pub enum Next<S, W: Written> {
    /// Look up the recipient's route ([`SendProcess::to`], no fresh
    /// lookup); a send is refused only when no relay serves it.
    LookupRoute,
    /// Ask the sender's account, answered once durable.
    AskSender(AccountCmd<S>),
    /// Ask the recipient's account ([`SendProcess::to`]) for its receipt,
    /// answered at once: the sender's later durable commit covers it.
    Receive(AccountCmd<S>),
    /// Refuse the request once everything written so far is durable (the
    /// refusal rests on the recipient's receipt).
    RefuseWhenDurable(RelayError),
    /// Answer the client with the sender's reply. `finished`: the
    /// delivery ended by this request's own commit.
    Answer { reply: Reply<W>, finished: Option<Finished> },
}

/// The message of a delivery that ended at acceptance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finished {
    pub from: String,
    pub message_id: String,
    pub to: String,
    pub accepted_at: UnixSecs,
}

impl SendProcess {
    /// `message.send` by `device` of `account`: refused at once for a
    /// malformed recipient, else its first step.
    pub fn start<S, W: Written>(
        account: &str,
        device: String,
        params: SendParams,
        digest: String,
    ) -> Result<(Self, Next<S, W>), RelayError> {
        let to = params.envelope.to.clone();
        relay_schemas::ids::check_account_id("envelope.to", &to)?;
        if to == account {
            // Self-delivery: the sender's account writes the record itself.
            let mut process = SendProcess { to, route: None, phase: Phase::Done };
            let next = process.decide(device, params, digest);
            return Ok((process, next));
        }
        let routing = Phase::Routing { device, params: Box::new(params), digest };
        Ok((SendProcess { to, route: None, phase: routing }, Next::LookupRoute))
    }

    /// The recipient account.
    pub fn to(&self) -> &str {
        &self.to
    }

    /// The next step after `input`; an input the current step does not
    /// expect is an internal error.
    pub fn on<S, W: Written>(&mut self, input: Input<W>) -> Result<Next<S, W>, RelayError> {
        match (std::mem::replace(&mut self.phase, Phase::Done), input) {
            (Phase::Routing { device, params, digest }, Input::Routed(route)) => {
                self.route = route;
                Ok(self.decide(device, *params, digest))
            }
            (Phase::Deciding, Input::Replied(Reply::Accept(acceptance))) => {
                let receipt = AccountCmd::MessageDeliver {
                    params: (*acceptance.deliver).clone(),
                    digest: acceptance.deliver_digest.clone(),
                };
                self.phase = Phase::Receiving(acceptance);
                Ok(Next::Receive(receipt))
            }
            (Phase::Deciding, Input::Replied(reply)) => Ok(Next::Answer { reply, finished: None }),
            (Phase::Receiving(_), Input::Received(AttemptOutcome::Rejected(e)))
                if e.code == ErrorCode::StateConflict =>
            {
                // The recipient holds other deliver params under this
                // message id: another content under the same id, racing
                // this send, was received first, or a retry after a crash
                // differs from the original. Settling this one `failed`
                // could let it win the sender's ledger while the recipient
                // holds the other content, so nothing is written.
                Ok(Next::RefuseWhenDurable(e))
            }
            (Phase::Receiving(acceptance), Input::Received(outcome)) => {
                let accepted_at = UnixSecs(acceptance.status.accepted_at);
                let env = &acceptance.deliver.envelope;
                let finished = Finished {
                    from: env.from.clone(),
                    message_id: env.message_id.clone(),
                    to: env.to.clone(),
                    accepted_at,
                };
                self.phase = Phase::Writing(finished);
                Ok(Next::AskSender(match final_status(&outcome, accepted_at) {
                    Some(status) => AccountCmd::Settle { acceptance, status },
                    // The attempt is recorded with the acceptance; the
                    // timetable makes the next one.
                    None => AccountCmd::Accept { acceptance, route: self.route.clone(), first: Some(outcome) },
                }))
            }
            (Phase::Writing(finished), Input::Replied(reply)) => {
                // `Settled` only when this request's commit wrote the final
                // status (a racing retry that settled first answers `Status`).
                let finished = matches!(reply, Reply::Settled { .. }).then_some(finished);
                Ok(Next::Answer { reply, finished })
            }
            (phase, input) => {
                let e = RelayError::internal(format!("message.send in {phase:?} cannot take {input:?}"));
                self.phase = phase;
                Err(e)
            }
        }
    }

    /// The sender's account decides the send with the route looked up.
    fn decide<S, W: Written>(&mut self, device: String, params: SendParams, digest: String) -> Next<S, W> {
        self.phase = Phase::Deciding;
        Next::AskSender(AccountCmd::MessageSend { device, params, digest, route: self.route.clone() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::account::testkit::*;
    use crate::account::AsDecided;
    use relay_schemas::DeliveryStatus;

    type Step = Next<(), AsDecided>;

    fn start(account: &str, v: &Value) -> Result<(SendProcess, Step), RelayError> {
        SendProcess::start(account, "phone".into(), parse(v), digest(v))
    }

    /// Alice's send to Bob, Bob served by this relay alone: the process
    /// waiting for Bob's receipt, and the acceptance Alice's account decided.
    fn receiving() -> (SendProcess, Box<Acceptance>) {
        let (mut p, _) = start(&alice().id, &alice_to_bob(1)).unwrap();
        let route = wire(&route(&bob(), 1, &[RELAY]));
        let Ok(Step::AskSender(cmd)) = p.on(Input::Routed(Some(route))) else { panic!("expected the decision") };
        let Reply::Accept(acceptance) = when(&given_alice([]), cmd).unwrap().reply else {
            panic!("expected an acceptance to deliver first")
        };
        let Ok(Step::Receive(_)) = p.on(Input::Replied(Reply::Accept(acceptance.clone()))) else {
            panic!("expected the receipt")
        };
        (p, acceptance)
    }

    fn answered(status: DeliveryStatus) -> Input<AsDecided> {
        Input::Received(AttemptOutcome::Answered(status))
    }

    #[test]
    fn a_send_to_another_account_looks_up_the_recipients_route_first() {
        let (p, next) = start(&alice().id, &alice_to_bob(1)).unwrap();
        assert!(matches!(next, Step::LookupRoute), "{next:?}");
        assert_eq!(p.to(), bob().id);
    }

    #[test]
    fn a_self_send_skips_the_route_lookup_and_is_decided_at_once() {
        let v = send_value(envelope(&phone(), &alice(), &alice(), 1, NOW), &["laptop"], None);
        let (_, next) = start(&alice().id, &v).unwrap();
        assert!(matches!(next, Step::AskSender(AccountCmd::MessageSend { route: None, .. })), "{next:?}");
    }

    #[test]
    fn a_malformed_recipient_is_refused_before_any_step() {
        let mut v = alice_to_bob(1);
        v["envelope"]["to"] = "not an id!".into();
        assert_eq!(start(&alice().id, &v).unwrap_err().code, ErrorCode::InvalidParams);
    }

    #[test]
    fn the_send_is_decided_with_the_route_looked_up() {
        let (mut p, _) = start(&alice().id, &alice_to_bob(1)).unwrap();
        let route = wire::<Route>(&route(&bob(), 3, &["relay-b"]));
        let next: Step = p.on(Input::Routed(Some(route))).unwrap();
        let Step::AskSender(AccountCmd::MessageSend { route: Some(r), .. }) = next else { panic!("{next:?}") };
        assert_eq!(r.revision, 3);
    }

    #[test]
    fn a_decision_that_is_not_an_acceptance_to_deliver_first_is_the_answer() {
        let (mut p, _) = start(&alice().id, &alice_to_bob(1)).unwrap();
        let _: Step = p.on(Input::Routed(None)).unwrap();
        let next: Step = p.on(Input::Replied(Reply::Status(DeliveryStatus::delivering(NOW)))).unwrap();
        assert!(matches!(next, Step::Answer { reply: Reply::Status(_), finished: None }), "{next:?}");
    }

    #[test]
    fn an_acceptance_to_deliver_first_asks_the_recipient_for_its_receipt_of_the_decided_params() {
        let (mut p, _) = start(&alice().id, &alice_to_bob(1)).unwrap();
        let _: Step = p.on(Input::Routed(None)).unwrap();
        let route = wire(&route(&bob(), 1, &[RELAY]));
        let cmd = AccountCmd::MessageSend {
            device: "phone".into(),
            params: parse(&alice_to_bob(1)),
            digest: digest(&alice_to_bob(1)),
            route: Some(route),
        };
        let Reply::Accept(a) = when(&given_alice([]), cmd).unwrap().reply else { panic!("expected an acceptance") };
        let next: Step = p.on(Input::Replied(Reply::Accept(a.clone()))).unwrap();
        let Step::Receive(AccountCmd::MessageDeliver { params, digest }) = next else { panic!("{next:?}") };
        assert_eq!(params.envelope.message_id, a.deliver.envelope.message_id);
        assert_eq!(digest, a.deliver_digest);
    }

    #[test]
    fn a_state_conflict_at_the_recipient_is_refused_once_durable_and_writes_nothing_at_the_sender() {
        let (mut p, _) = receiving();
        let conflict = RelayError::new(ErrorCode::StateConflict, "other params under this id");
        let next: Step = p.on(Input::Received(AttemptOutcome::Rejected(conflict))).unwrap();
        assert!(matches!(&next, Step::RefuseWhenDurable(e) if e.code == ErrorCode::StateConflict), "{next:?}");
    }

    #[test]
    fn a_receipt_taken_settles_the_acceptance_as_target_accepted() {
        let (mut p, a) = receiving();
        let next: Step = p.on(answered(DeliveryStatus::target_accepted(NOW))).unwrap();
        let Step::AskSender(AccountCmd::Settle { status, .. }) = next else { panic!("{next:?}") };
        assert_eq!(status, DeliveryStatus::target_accepted(a.status.accepted_at));
    }

    #[test]
    fn a_receipt_refused_for_good_settles_the_acceptance_as_failed() {
        let (mut p, _) = receiving();
        let refused = RelayError::new(ErrorCode::Forbidden, "not a contact");
        let next: Step = p.on(Input::Received(AttemptOutcome::Rejected(refused))).unwrap();
        let Step::AskSender(AccountCmd::Settle { status, .. }) = next else { panic!("{next:?}") };
        assert_eq!(status.error.map(|e| e.code), Some(ErrorCode::Forbidden));
    }

    #[test]
    fn a_receipt_that_does_not_end_the_delivery_is_written_with_the_acceptance_and_the_route() {
        let (mut p, _) = receiving();
        let busy = RelayError::unavailable("the recipient's account is busy");
        let next: Step = p.on(Input::Received(AttemptOutcome::NotAttempted(busy))).unwrap();
        let Step::AskSender(AccountCmd::Accept {
            route: Some(r), first: Some(AttemptOutcome::NotAttempted(_)), ..
        }) = next
        else {
            panic!("{next:?}")
        };
        assert!(r.lists_relay(RELAY));
    }

    #[test]
    fn a_settlement_written_by_this_request_reports_the_delivery_finished() {
        let (mut p, a) = receiving();
        let _: Step = p.on(answered(DeliveryStatus::target_accepted(NOW))).unwrap();
        let settled = Reply::Settled { status: DeliveryStatus::target_accepted(NOW), head: () };
        let next: Step = p.on(Input::Replied(settled)).unwrap();
        let Step::Answer { finished: Some(f), .. } = next else { panic!("{next:?}") };
        assert_eq!((f.from, f.to), (alice().id, bob().id));
        assert_eq!(f.message_id, a.deliver.envelope.message_id);
        assert_eq!(f.accepted_at, UnixSecs(a.status.accepted_at));
    }

    #[test]
    fn a_settlement_a_racing_retry_wrote_first_is_answered_but_not_reported_again() {
        let (mut p, _) = receiving();
        let _: Step = p.on(answered(DeliveryStatus::target_accepted(NOW))).unwrap();
        let next: Step = p.on(Input::Replied(Reply::Status(DeliveryStatus::target_accepted(NOW)))).unwrap();
        assert!(matches!(next, Step::Answer { reply: Reply::Status(_), finished: None }), "{next:?}");
    }

    #[test]
    fn an_input_the_step_does_not_expect_is_an_internal_error() {
        let (mut p, _) = start(&alice().id, &alice_to_bob(1)).unwrap();
        let e = p.on::<(), AsDecided>(answered(DeliveryStatus::target_accepted(NOW))).unwrap_err();
        assert_eq!(e.code, ErrorCode::InternalError);
        // Still waiting for the route.
        assert!(matches!(p.on::<(), AsDecided>(Input::Routed(None)), Ok(Next::AskSender(_))));
    }
}
