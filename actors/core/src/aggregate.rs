//! The one shape every aggregate has (an account, a delivery): a state
//! folded from its own events by `apply`, which cannot fail, and `decide`,
//! which turns a command into a [`Decision`] (the events to append in one
//! commit, the reply, the effects the shell carries out once they are
//! durable) or the `RelayError` that refuses it, writing nothing.
//!
//! `Env` is everything a decision is given besides the state and the
//! command: time and policy, and for an account its store view
//! ([`crate::account::Reads`]), randomness and challenge book.

use relay_schemas::RelayError;

/// What a command decided.
#[derive(Debug)]
pub struct Decision<Event, Reply, Effect> {
    pub events: Vec<Event>,
    pub reply: Reply,
    pub effects: Vec<Effect>,
}

impl<Event, Reply, Effect> Decision<Event, Reply, Effect> {
    /// Writes nothing; answers `reply`.
    pub fn reply(reply: Reply) -> Self {
        Decision { events: Vec::new(), reply, effects: Vec::new() }
    }

    /// Writes `events`; answers `reply`.
    pub fn write(events: Vec<Event>, reply: Reply) -> Self {
        Decision { events, reply, effects: Vec::new() }
    }
}

/// A decision, or the refusal that writes nothing.
pub type Decided<Event, Reply, Effect> = Result<Decision<Event, Reply, Effect>, RelayError>;

/// An event-sourced aggregate taking commands `Cmd` under `Env`.
pub trait Aggregate<Cmd, Env> {
    type Event;
    type Reply;
    type Effect;

    /// Decides `cmd` on this state. Pure: on error nothing is to be written.
    fn decide(&self, cmd: &Cmd, env: Env) -> Decided<Self::Event, Self::Reply, Self::Effect>;

    /// Folds one event in. Cannot fail: an event is a fact already written.
    fn apply(&mut self, event: &Self::Event);
}
