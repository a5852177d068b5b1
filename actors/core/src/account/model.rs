//! The account aggregate against a model: random histories of receipts
//! (`message.deliver` from Bob), self-sends (`message.send` to Alice
//! herself), acks and backlog reads, some repeating a message id with the
//! same content and some with other content, run through the account's
//! `Aggregate::decide` and `apply` as the actor runs them. After every command the answer and
//! the state must be what a plain model says: a message id is accepted
//! once, its retry answered with the first result and no event, other
//! content under it refused `state_conflict`; every record takes the next
//! timeline sequence; a device's cursor only moves forward and never past
//! the last record; the backlog is the last record beyond the cursor.

use super::testkit::*;
use super::AccountEnv;
use crate::aggregate::Aggregate;
use proptest::prelude::*;
use std::collections::BTreeMap;

const DEVICES: [&str; 2] = ["phone", "laptop"];

#[derive(Clone, Debug)]
enum Step {
    /// Bob's `message.deliver` of message `n`, its content variant `v`.
    Receive {
        n: u32,
        v: u8,
    },
    /// Alice's phone sends message `n` to herself, content variant `v`.
    SelfSend {
        n: u32,
        v: u8,
    },
    Ack {
        device: usize,
        through: u64,
    },
    Backlog {
        device: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u32..5, 0u8..2).prop_map(|(n, v)| Step::Receive { n, v }),
        (10u32..15, 0u8..2).prop_map(|(n, v)| Step::SelfSend { n, v }),
        (0usize..2, 0u64..12).prop_map(|(device, through)| Step::Ack { device, through }),
        (0usize..2).prop_map(|device| Step::Backlog { device }),
    ]
}

/// The ciphertext of content variant `v`.
fn content(v: u8) -> Vec<u8> {
    format!("opaque ciphertext {v}").into_bytes()
}

fn command(step: &Step) -> Cmd {
    match step {
        Step::Receive { n, v } => {
            let env = bob_phone().envelope(&bob().id, &alice().id, &mid(*n), NOW, &content(*v));
            let params =
                with_auth(deliver_value(env, &DEVICES, cert(&bob(), &bob_phone())), grant_auth(grant_alice_to_bob()));
            AccountCmd::MessageDeliver { params: parse(&params), digest: digest(&params) }
        }
        Step::SelfSend { n, v } => {
            let env = phone().envelope(&alice().id, &alice().id, &mid(*n), NOW, &content(*v));
            let params = send_value(env, &DEVICES, None);
            AccountCmd::MessageSend {
                device: "phone".into(),
                params: parse(&params),
                digest: digest(&params),
                route: None,
            }
        }
        Step::Ack { device, through } => AccountCmd::MessageTimelineAck {
            device: DEVICES[*device].into(),
            params: parse(&json!({ "through": through })),
        },
        Step::Backlog { device } => AccountCmd::Backlog { device: DEVICES[*device].into() },
    }
}

/// What the model holds: the content accepted under each message id (Bob's
/// and Alice's own, apart), the last timeline sequence, each device's cursor.
#[derive(Debug, Default)]
struct Model {
    received: BTreeMap<u32, u8>,
    sent: BTreeMap<u32, u8>,
    last: u64,
    cursors: [u64; 2],
}

/// What a command should come to: an error code, or the events' count and
/// the reply it answers.
#[derive(Debug, PartialEq)]
enum Expect {
    Refused(ErrorCode),
    Written(usize, Answer),
}

#[derive(Debug, PartialEq)]
enum Answer {
    Accepted,
    Ok,
    Backlog(Option<u64>),
}

impl Model {
    /// The expectation for `step`, and the model after it.
    fn step(&mut self, step: &Step) -> Expect {
        let once = |seen: &mut BTreeMap<u32, u8>, last: &mut u64, n: u32, v: u8| match seen.get(&n) {
            Some(first) if *first == v => Expect::Written(0, Answer::Accepted),
            Some(_) => Expect::Refused(ErrorCode::StateConflict),
            None => {
                seen.insert(n, v);
                *last += 1;
                Expect::Written(1, Answer::Accepted)
            }
        };
        match step {
            Step::Receive { n, v } => once(&mut self.received, &mut self.last, *n, *v),
            Step::SelfSend { n, v } => once(&mut self.sent, &mut self.last, *n, *v),
            Step::Ack { through, .. } if *through > self.last => Expect::Refused(ErrorCode::InvalidParams),
            Step::Ack { device, through } if *through <= self.cursors[*device] => Expect::Written(0, Answer::Ok),
            Step::Ack { device, through } => {
                self.cursors[*device] = *through;
                Expect::Written(1, Answer::Ok)
            }
            Step::Backlog { device } => {
                Expect::Written(0, Answer::Backlog((self.last > self.cursors[*device]).then_some(self.last)))
            }
        }
    }
}

fn answer(reply: &Reply) -> Answer {
    match reply {
        Reply::Status(s) if s.status == Status::TargetAccepted => Answer::Accepted,
        Reply::Json(j) if j == "{}" => Answer::Ok,
        Reply::Backlog(b) => Answer::Backlog(*b),
        other => panic!("an answer the model does not know: {other:?}"),
    }
}

fn run(steps: &[Step]) -> Result<(), TestCaseError> {
    let mut s = given_alice([]);
    let mut m = Model::default();
    let start = s.last_sequence;
    m.last = start;
    for step in steps {
        let expect = m.step(step);
        let mut challenges = Challenges::default();
        let env = AccountEnv { ctx: at(NOW), reads: &s, challenges: &mut challenges };
        let decided = s.state.decide(&command(step), env);
        let got = match &decided {
            Ok(d) => Expect::Written(d.events.len(), answer(&d.reply)),
            Err(e) => Expect::Refused(e.code),
        };
        prop_assert_eq!(&got, &expect, "{:?}", step);
        for e in decided.map(|d| d.events).unwrap_or_default() {
            if let Some(r) = e.record() {
                prop_assert_eq!(r.sequence, s.last_sequence + 1, "a record takes the next sequence");
            }
            s.apply(&e);
        }
        prop_assert_eq!(s.last_sequence, m.last);
        for (i, d) in DEVICES.iter().enumerate() {
            prop_assert_eq!(s.cursors.get(d).copied().unwrap_or(0), m.cursors[i], "{}'s cursor", d);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn an_account_follows_the_model_of_idempotent_receipts_sends_and_cursors_over_random_histories(
        steps in prop::collection::vec(step(), 1..24)
    ) {
        run(&steps)?;
    }
}
