//! `timeline.replicate` (PROTOCOL §5): the two home relays of an account
//! keep each other up to date with a pull whose items are acknowledged, as
//! SHiNE's access servers do with `DmSyncBatch` and `ackSyncIds`.
//!
//! The outbox is the account's own stream: every event a client, a
//! sender's relay or a delivery wrote here ([`offered`]), in stream order,
//! under the serving relay's stream sequence. What came from the partner
//! is wrapped in [`AccountEvent::Replicated`] and never offered back, so
//! nothing loops; per-device read cursors and push subscriptions stay with
//! the home they were made at (timeline sequences are per home).
//!
//! Serving ([`serve`]): `ack` marks the items through it synced (never
//! beyond the last page actually sent); the page starts after `min(after,
//! acked)`, so unacknowledged items come again after a disconnect, and a
//! reset (`acked` back to 0) sends history again. Settings and devices
//! come before messages within a page.
//!
//! Applying ([`apply`]): each item is the partner's claim, decided as the
//! command that wrote it would be here (PROTOCOL §5 *What a partner home
//! may replicate*), and one that fails refuses the whole page: account
//! objects are verified again under the account key, a received record
//! under its sender's certificate ([`check_received`]), a sent one under
//! a device valid here at its `created_at` ([`check_sent`]); times are
//! this relay's ([`sent_times`], [`clamped_time`]). Messages are
//! deduplicated by the ledger (one record per message whichever home
//! accepted it, and a reset re-delivers nothing), records take this
//! relay's next sequence. A sent message still delivering is delivered
//! from here too, from a device valid now, by this relay's own delivery
//! state with the original `accepted_at` and the deadline recomputed here
//! ([`DeliveryCmd::Forward`]).
//!
//! Pulling ([`pull`]): what the puller asks next and when it is done.
//!
//! Timeline order both homes agree on: each home numbers its records in
//! the order it stored them (`sequence`, the sync cursor), and a record's
//! place in the conversation is `(envelope.created_at,
//! envelope.message_id)`, the same at both homes.

pub mod pull;

use super::{contact_revoke, device_add, device_revoke, message_deliver, message_send, route_update};
use crate::account::decision::json;
use crate::account::decision::{Decision, Effect, Outcome, Reads, Reply};
use crate::account::events::{AccountEvent, Record};
use crate::account::ledger::{Ledger, SendEntry};
use crate::account::shared::{not_served_here, Ctx};
use crate::account::state::AccountState;
use crate::account::timeline::fits_page;
use crate::delivery::aggregate::{begin, Begun, DeliveryCmd, DeliveryCtx};
use relay_schemas::methods::{DeliverParams, ReplicateParams};
use relay_schemas::objects::{DeliveryStatus, DeviceCertificate, MessageEnvelope, Registration, Route, Status, Wire};
use relay_schemas::sign::Tag;
use relay_schemas::{ErrorCode, RelayError, UnixSecs};
use serde::{Deserialize, Serialize};

/// `TimelineReplicate`: serves `peer` a page of the account's stream,
/// writing how far it acknowledged.
pub(crate) fn decide(
    state: &AccountState,
    peer: &str,
    params: &ReplicateParams,
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    let (events, page) = serve(state, peer, params, reads, ctx)?;
    Ok(Decision::write(events, json(&page)?))
}

/// `ReplicaApply`: a page pulled from `partner`, decided item by item.
pub(crate) fn decide_apply(
    state: &AccountState,
    partner: &str,
    page: &Page,
    known: Option<&Wire<Route>>,
    senders: &[Wire<DeviceCertificate>],
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<Decision, RelayError> {
    let applied = apply(state, partner, page, known, senders, reads, ctx)?;
    let reply = Reply::Replica(Outcome::Applied { items: applied.applied });
    // A revocation made at the other home ends the device here too.
    let revoked = applied.events.iter().filter_map(|e| match e.origin() {
        AccountEvent::DeviceRevoked { revocation } => Some(revocation.device_id.clone()),
        _ => None,
    });
    let mut effects: Vec<Effect> = revoked.map(|device_id| Effect::EndDevice { device_id }).collect();
    effects.extend(applied.forwarded.into_iter().map(|b| Effect::Forward(Box::new(b))));
    Ok(Decision { events: applied.events, reply, effects })
}

/// `ReplicaMoved`: `partner` answered `route_stale` with `route`.
pub(crate) fn decide_moved(state: &AccountState, partner: &str, route: &Wire<Route>, ctx: Ctx) -> Decision {
    Decision::write(moved(state, partner, route, ctx), Reply::ok())
}

/// `ReplicaCursor`: where the next pull from `partner` starts.
pub(crate) fn decide_cursor(state: &AccountState, partner: &str) -> Decision {
    Decision::reply(Reply::Replica(Outcome::Cursor(state.replica(partner).pulled)))
}

/// `ReplicaReset`: everything is offered to `partner` again.
pub(crate) fn decide_reset(state: &AccountState, partner: &str) -> Decision {
    let mark = state.replica(partner);
    let events = match mark.served > 0 || mark.acked > 0 {
        true => vec![AccountEvent::ReplicaReset { partner: partner.to_owned() }],
        false => vec![],
    };
    Decision::write(events, Reply::ok())
}

/// One replicated event of the serving relay's account stream.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Item {
    /// Its sequence in the serving relay's stream of the account.
    pub sequence: u64,
    pub event: AccountEvent,
    /// A sent message's delivery status at the serving relay now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<DeliveryStatus>,
    /// A sent message still delivering: its delivery's params, so the
    /// sender's other home can deliver it too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deliver: Option<Box<DeliverParams>>,
}

/// The `timeline.replicate` result.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Page {
    pub items: Vec<Item>,
    /// The cursor to ask after next (the last event looked at).
    pub next: u64,
    pub has_more: bool,
    /// The account's current route at the serving relay (an extension
    /// member): a relay the account just gained as a home learns from it
    /// that it is one, whatever routes the history holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<Wire<Route>>,
}

/// Events looked at per page at most, offered or not: a long run of
/// events that are not replicated costs a bounded amount per request.
pub const SCAN_PER_PAGE: usize = 2_000;

/// Whether the partner gets this event.
pub fn offered(event: &AccountEvent) -> bool {
    use AccountEvent::*;
    match event {
        Registered { .. } | DeviceAdded { .. } | DeviceRevoked { .. } | SettingsUpdated { .. } => true,
        RouteUpdated { .. } | ContactRevoked { .. } => true,
        MessageSent { .. } | SelfDelivered { .. } | MessageReceived { .. } | DeliveryUpdated { .. } => true,
        // Per home: read cursors (sequences differ), push subscriptions
        // (the home a device subscribed at wakes it), replication itself.
        CursorMoved { .. } | PushSubscribed { .. } | PushUnsubscribed { .. } => false,
        Replicated { .. } | ReplicaPulled { .. } | ReplicaServed { .. } | ReplicaAcked { .. } => false,
        ReplicaReset { .. } => false,
    }
}

/// What `partner` is offered of a stored event: an event written here if
/// [`offered`]; one this relay got from another relay (a home the account
/// had before) as that relay wrote it; never one back to where it came from.
pub fn offered_to<'e>(event: &'e AccountEvent, partner: &str) -> Option<&'e AccountEvent> {
    match event {
        AccountEvent::Replicated { partner: from, event, .. } => {
            (from != partner && offered(event)).then_some(&**event)
        }
        e => offered(e).then_some(e),
    }
}

/// Account objects (settings and devices) go before messages in a page.
fn is_message(event: &AccountEvent) -> bool {
    event.record().is_some() || matches!(event, AccountEvent::MessageSent { .. } | AccountEvent::DeliveryUpdated { .. })
}

/// Replication of this account with `partner` is allowed: the account's
/// route names both this relay and the partner. A partner the route no
/// longer names (the account moved) gets `route_stale` with the route, so
/// it learns the move ([`moved`]).
pub fn may_replicate(state: &AccountState, partner: &str, ctx: Ctx) -> Result<(), RelayError> {
    let route = state.route().ok_or_else(|| RelayError::not_found("unknown account"))?;
    if partner == ctx.policy.relay_id {
        return Err(RelayError::forbidden("a relay does not replicate with itself"));
    }
    if !route.lists_relay(&ctx.policy.relay_id) || !route.lists_relay(partner) {
        return Err(not_served_here(Some(route)));
    }
    Ok(())
}

/// The partner answered `route_stale` with `route`: the account moved.
/// A valid higher revision of the account's route is kept here (as came
/// from the partner), so this relay stops serving an account that left it.
pub fn moved(state: &AccountState, partner: &str, route: &Wire<Route>, ctx: Ctx) -> Vec<AccountEvent> {
    if !state.is_registered() || state.route().is_some_and(|r| r.revision >= route.revision) {
        return vec![];
    }
    match route_update::update_route(state, route, ctx) {
        Ok(events) => events
            .into_iter()
            .map(|e| AccountEvent::Replicated { partner: partner.to_owned(), origin_seq: 0, event: Box::new(e) })
            .collect(),
        Err(_) => vec![],
    }
}

/// `timeline.replicate` from `partner`: the events to write (the new
/// acknowledgement and sent mark) and the page.
pub fn serve(
    state: &AccountState,
    partner: &str,
    p: &ReplicateParams,
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<(Vec<AccountEvent>, Page), RelayError> {
    may_replicate(state, partner, ctx)?;
    if p.limit == 0 || p.limit > relay_schemas::methods::REPLICATE_MAX_LIMIT {
        return Err(RelayError::invalid_params("limit must be 1..=500"));
    }
    let mark = state.replica(partner);
    let acked = p.ack.map_or(mark.acked, |ack| ack.min(mark.served).max(mark.acked));
    let from = p.after.min(acked);
    let mut page = Page { items: Vec::new(), next: from, has_more: false, route: state.route().cloned() };
    let mut bytes = 0;
    let mut events = reads.events_after(from).peekable();
    let mut scanned = 0;
    while scanned < SCAN_PER_PAGE {
        let Some(next) = events.next() else { break };
        scanned += 1;
        let (seq, event) = next?;
        if let Some(event) = offered_to(&event, partner) {
            if page.items.len() >= p.limit as usize {
                page.has_more = true;
                break;
            }
            let item = item(seq, event.clone(), reads)?;
            if !claimable(state, &item, ctx) {
                page.next = seq;
                continue;
            }
            let size = serde_json::to_vec(&item).map_err(|e| RelayError::internal(e.to_string()))?.len();
            if !fits_page(bytes, page.items.len(), size, ctx.policy.max_page_bytes) {
                page.has_more = true;
                break;
            }
            bytes += size;
            page.items.push(item);
        }
        page.next = seq;
    }
    if !page.has_more {
        page.has_more = events.peek().is_some();
    }
    // Stable: account objects first, then messages, each in stream order.
    page.items.sort_by_key(|i| is_message(&i.event));
    let mut written = Vec::new();
    if acked > mark.acked {
        written.push(AccountEvent::ReplicaAcked { partner: partner.to_owned(), through: acked });
    }
    // Only a page with items is remembered as sent: acks never go beyond
    // one, and polling an idle account writes nothing. A page that used its
    // whole scan on events not offered is remembered too (once per
    // SCAN_PER_PAGE events), so the partner's ack can pass them.
    let exhausted = page.items.is_empty() && scanned == SCAN_PER_PAGE;
    if (!page.items.is_empty() || exhausted) && page.next > mark.served {
        written.push(AccountEvent::ReplicaServed { partner: partner.to_owned(), through: page.next });
    }
    Ok((written, page))
}

/// Whether this home still claims `item` to its partner. A sent message
/// whose envelope comes from a device this home now knows was not valid at
/// its `created_at` (revoked by then, as learned from the partner after
/// accepting it) is one the partner must refuse, with the whole page
/// (PROTOCOL §5 *What a partner home may replicate*): offering it would
/// stop replication of the account until its delivery ended. It is passed
/// over instead, as the partner's own acceptance would have been refused.
fn claimable(state: &AccountState, item: &Item, ctx: Ctx) -> bool {
    let record = match &item.event {
        AccountEvent::MessageSent { record, .. } => record.as_deref(),
        AccountEvent::SelfDelivered { record, .. } => Some(&**record),
        _ => return true,
    };
    envelopes_of(record, item.deliver.as_deref()).all(|env| {
        state.device_key_at(&env.from_device_id, UnixSecs(env.created_at), ctx.policy.clock_tolerance).is_some()
    })
}

fn item(sequence: u64, event: AccountEvent, reads: &impl Reads) -> Result<Item, RelayError> {
    let (status, deliver) = match &event {
        AccountEvent::MessageSent { message_id, .. } => {
            let status = reads.send_entry(message_id)?.map(|e| e.status);
            let delivering = status.as_ref().is_some_and(|s| !s.status.is_terminal());
            let deliver = if delivering { reads.delivery_params(message_id)?.map(Box::new) } else { None };
            (status, deliver)
        }
        _ => (None, None),
    };
    Ok(Item { sequence, event, status, deliver })
}

/// What applying a page decided.
#[derive(Debug, Default)]
pub struct Applied {
    /// Each item's events, wrapped as [`AccountEvent::Replicated`], then
    /// the new cursor.
    pub events: Vec<AccountEvent>,
    /// Deliveries this relay takes on for sent messages still delivering.
    pub forwarded: Vec<Begun>,
    /// How many of the page's items wrote something here (the others were
    /// known already).
    pub applied: usize,
}

/// Applies a page pulled from `partner`. `known`: the account's highest
/// route this relay knows or learned from its peers just now, which the
/// page's route must not be older than when the page brings the account
/// here. `senders`: certificates for received records that carry none,
/// from the senders' own homes (see [`check_received`]).
///
/// PROTOCOL §5 *What a partner home may replicate*: every item is the
/// partner's claim, checked as the request that wrote it would be here.
/// One item that fails refuses the page (`invalid_params` / `forbidden`),
/// and nothing of it is written: the cursor stays, so an honest partner's
/// page comes again and a hostile one's never lands.
pub fn apply(
    state: &AccountState,
    partner: &str,
    page: &Page,
    known: Option<&Wire<Route>>,
    senders: &[Wire<DeviceCertificate>],
    reads: &impl Reads,
    ctx: Ctx,
) -> Result<Applied, RelayError> {
    match state.is_registered() {
        true => may_replicate(state, partner, ctx)?,
        false => arriving(state, partner, page.route.as_ref(), known, ctx)?,
    }
    let mut scratch = state.clone();
    let mut out = Applied::default();
    // What this relay already passed (a reset sends it again): known.
    let pulled = state.replica(partner).pulled;
    // The ledger entries this page writes, for the items after them.
    let mut page_ledger = Ledger::default();
    for item in page.items.iter().filter(|i| i.sequence > pulled) {
        let decided = if scratch.is_registered() || matches!(item.event, AccountEvent::Registered { .. }) {
            decide_item(&scratch, item, senders, reads, &page_ledger, ctx)
        } else {
            Err(RelayError::forbidden("the partner offered no registration of the account"))
        };
        let (events, begun) = decided.map_err(|e| match e.code {
            // This relay could not decide (a store read failed): the same
            // page comes again.
            ErrorCode::InternalError => e,
            _ => refused(item, e),
        })?;
        out.applied += usize::from(!events.is_empty());
        for event in events {
            page_ledger.apply(&state.account_id, &event);
            let wrapped = AccountEvent::Replicated {
                partner: partner.to_owned(),
                origin_seq: item.sequence,
                event: Box::new(event),
            };
            scratch.apply(&wrapped);
            out.events.push(wrapped);
        }
        out.forwarded.extend(begun);
    }
    if !scratch.is_registered() {
        // Nothing of an account that is not here: no stream for a stranger.
        out.events.clear();
        return Ok(out);
    }
    // The partner's current route, when the history ends on an older one
    // (a home added by a route update).
    if let Some(route) = page.route.as_ref().filter(|r| scratch.route().is_some_and(|s| r.revision > s.revision)) {
        let moved = moved(&scratch, partner, route, ctx);
        moved.iter().for_each(|e| scratch.apply(e));
        out.events.extend(moved);
    }
    if !page.items.is_empty() && page.next > pulled {
        out.events.push(AccountEvent::ReplicaPulled { partner: partner.to_owned(), through: page.next });
    }
    Ok(out)
}

/// The page is refused for `item`: `forbidden` or `invalid_params` (as
/// the item's own rule said, other codes as `forbidden`), naming the item;
/// an item past this home's size bounds stays `payload_too_large` with the
/// setting in `data.limit` (PROTOCOL §1).
fn refused(item: &Item, e: RelayError) -> RelayError {
    let why = format!("replicated item {} ({}) refused: {}", item.sequence, item.event.event_type(), e.message);
    match e.code {
        ErrorCode::InvalidParams => RelayError::invalid_params(why),
        ErrorCode::PayloadTooLarge => RelayError { message: why, ..e },
        _ => RelayError::forbidden(why),
    }
}

/// A received record is the claim that a device of its sender signed
/// this envelope for this account: it must name this account as `to`,
/// and verify under the sender's certificate: the one kept with the
/// record at the home that accepted it, or, for a record accepted before
/// certificates were kept, one of `senders` (the sender's home's list).
/// A certificate is signed by the sender's account key, so neither the
/// partner nor the sender's home can make one up for a real sender.
pub fn check_received(
    state: &AccountState,
    from: &str,
    record: &Record,
    sender_certificate: Option<&Wire<DeviceCertificate>>,
    senders: &[Wire<DeviceCertificate>],
    max_bytes: usize,
) -> Result<(), RelayError> {
    let env = &record.envelope;
    if env.to != *state.account_id {
        return Err(RelayError::forbidden("a received record's envelope names another account as to"));
    }
    if env.from != from {
        return Err(RelayError::invalid_params("a received record's envelope is from another sender"));
    }
    let of_device = |c: &&Wire<DeviceCertificate>| c.account_id == env.from && c.device_id == env.from_device_id;
    let cert = sender_certificate
        .or_else(|| senders.iter().find(of_device))
        .ok_or_else(|| RelayError::forbidden("a received record without its sender's certificate"))?;
    let key = cert
        .check_signed(max_bytes)
        .map_err(|e| RelayError::forbidden(format!("sender certificate: {}", e.message)))?;
    if cert.account_id != env.from || cert.device_id != env.from_device_id {
        return Err(RelayError::forbidden("the sender certificate is not the envelope's sending device"));
    }
    env.verify(Tag::Envelope, &key).map_err(|e| RelayError::forbidden(format!("envelope: {}", e.message)))
}

/// An envelope this account sent (a sent or self-delivered record, or a
/// delivery to take on): it must name this account as `from`, and come
/// from a device valid in this home's own state at its `created_at`
/// (certificate on file, not revoked, not expired then), whose key it
/// verifies under.
pub fn check_sent(state: &AccountState, env: &Wire<MessageEnvelope>, ctx: Ctx) -> Result<(), RelayError> {
    if env.from != *state.account_id {
        return Err(RelayError::forbidden("a sent envelope names another account as from"));
    }
    if env.created_at > ctx.now.plus(ctx.policy.clock_tolerance).0 {
        return Err(RelayError::invalid_params("a sent envelope's created_at is beyond the clock tolerance"));
    }
    let at = UnixSecs(env.created_at);
    let key = state.device_key_at(&env.from_device_id, at, ctx.policy.clock_tolerance).ok_or_else(|| {
        RelayError::forbidden(format!("device {} was not valid here at created_at", env.from_device_id))
    })?;
    env.verify(Tag::Envelope, key).map_err(|e| RelayError::forbidden(format!("envelope: {}", e.message)))
}

/// A sent message's times as this relay would have fixed them (PROTOCOL
/// §6): `accepted_at` no later than now plus the clock tolerance, and the
/// deadline and retention recomputed from `created_at`, that
/// `accepted_at` and this relay's limits, never taken from the page.
/// `(accepted_at, deadline, retention_until)`.
pub fn sent_times(created_at: u64, accepted_at: u64, ctx: Ctx) -> (u64, u64, u64) {
    let accepted_at = accepted_at.min(ctx.now.plus(ctx.policy.clock_tolerance).0);
    let retention_until = accepted_at.saturating_add(ctx.policy.message_retention);
    let deadline = created_at.saturating_add(ctx.policy.delivery_age_limit).min(retention_until);
    (accepted_at, deadline, retention_until)
}

/// A time in an unsigned event (`settings_updated.at`): never later than
/// now plus the clock tolerance, so a partner cannot date a change into
/// the future and pin it against every later one.
pub fn clamped_time(at: u64, ctx: Ctx) -> u64 {
    at.min(ctx.now.plus(ctx.policy.clock_tolerance).0)
}

/// A page that would bring the account here: the partner's current route
/// (valid, this account's) must name both relays and be no older than any
/// route of the account this relay knows.
fn arriving(
    state: &AccountState,
    partner: &str,
    route: Option<&Wire<Route>>,
    known: Option<&Wire<Route>>,
    ctx: Ctx,
) -> Result<(), RelayError> {
    let route = route.ok_or_else(|| RelayError::forbidden("the partner sent no route of the account"))?;
    route.check(ctx.now, ctx.policy.clock_tolerance, ctx.policy.max_object_bytes)?;
    if route.account_id != state.account_id {
        return Err(RelayError::forbidden("the partner's route names another account"));
    }
    if !route.lists_relay(&ctx.policy.relay_id) || !route.lists_relay(partner) {
        return Err(not_served_here(Some(route)));
    }
    match known {
        Some(k) if k.revision > route.revision || (k.revision == route.revision && k != route) => {
            Err(RelayError::new(ErrorCode::RouteStale, "a newer route revision of this account is known")
                .with_data(serde_json::json!({ "route": k })))
        }
        _ => Ok(()),
    }
}

/// One item, decided as here: the events it writes (unwrapped) and the
/// delivery it begins, if any.
fn decide_item(
    state: &AccountState,
    item: &Item,
    senders: &[Wire<DeviceCertificate>],
    reads: &impl Reads,
    page_ledger: &Ledger,
    ctx: Ctx,
) -> Result<(Vec<AccountEvent>, Option<Begun>), RelayError> {
    let send_entry = |id: &str| -> Result<Option<SendEntry>, RelayError> {
        match page_ledger.send(id) {
            Some(e) => Ok(Some(e.clone())),
            None => reads.send_entry(id),
        }
    };
    let next_sequence = state.last_sequence + 1;
    let events = match &item.event {
        AccountEvent::Registered { route, device_certificate, public_discovery, registration, .. } => {
            if state.is_registered() {
                return Ok((vec![], None));
            }
            // Whichever relay it was made at: the account key's own signed
            // request, never public objects alone (the page's route, checked
            // in `arriving`, says this relay is a home now).
            let max_bytes = ctx.policy.max_object_bytes;
            route.check(ctx.now, ctx.policy.clock_tolerance, max_bytes)?;
            if route.account_id != state.account_id {
                return Err(RelayError::forbidden("route names another account"));
            }
            let registration = registration.as_ref().ok_or_else(|| RelayError::forbidden("no signed registration"))?;
            check_registration(registration, route, ctx)?;
            if registration.public_discovery != *public_discovery {
                return Err(RelayError::forbidden("settings disagree with the signed registration"));
            }
            check_replicated_certificate(device_certificate, ctx)?;
            if device_certificate.account_key != route.account_key {
                return Err(RelayError::forbidden("device_certificate names another account"));
            }
            vec![item.event.clone()]
        }
        AccountEvent::DeviceAdded { device_certificate } => {
            check_replicated_certificate(device_certificate, ctx)?;
            // The same certificate on file is known, even revoked since (a
            // client may add a device at both homes and revoke it at one
            // before that one pulls the other's add): as a new add of a
            // revoked id it would refuse the page, and every later one.
            if state.certificate(&device_certificate.device_id).as_ref() == Some(device_certificate) {
                return Ok((vec![], None));
            }
            device_add::add_signed_device(state, device_certificate, ctx.policy)?
        }
        AccountEvent::DeviceRevoked { revocation } => device_revoke::revoke_device(state, revocation, ctx)?,
        AccountEvent::SettingsUpdated { public_discovery, at } => {
            let at = at.map(|at| clamped_time(at, ctx));
            match later_setting(state, *public_discovery, at) {
                true => vec![AccountEvent::SettingsUpdated { public_discovery: *public_discovery, at }],
                false => vec![],
            }
        }
        // A revision older than this home's: history offered again, known.
        AccountEvent::RouteUpdated { route } if state.route().is_some_and(|r| route.revision < r.revision) => vec![],
        AccountEvent::RouteUpdated { route } => route_update::update_route(state, route, ctx)?,
        // Under this home's own cap, like a `contact.revoke` made here.
        AccountEvent::ContactRevoked { kind, id } => contact_revoke::revoke_contact_id(state, kind, id, ctx)?,
        AccountEvent::MessageReceived { from, message_id, record, sender_certificate, .. } => {
            check_received(state, from, record, sender_certificate.as_deref(), senders, ctx.policy.max_object_bytes)?;
            if record.envelope.message_id != *message_id {
                return Err(RelayError::invalid_params("a received record of another message"));
            }
            match reads.receipt_entry(from, message_id)? {
                // Accepted here too (both homes were tried in parallel), or a
                // reset sending it again: one record per message.
                Some(_) => vec![],
                None => vec![restamped(&item.event, next_sequence, ctx)],
            }
        }
        AccountEvent::SelfDelivered { message_id, record, .. } => {
            check_sent(state, &record.envelope, ctx)?;
            if record.envelope.to != *state.account_id || record.envelope.message_id != *message_id {
                return Err(RelayError::invalid_params("a self-delivered record of another message"));
            }
            match send_entry(message_id)? {
                Some(_) => vec![],
                None => vec![restamped(&item.event, next_sequence, ctx)],
            }
        }
        AccountEvent::MessageSent { message_id, to, record, status: settled, .. } => {
            for env in envelopes_of(record.as_deref(), item.deliver.as_deref()) {
                check_sent(state, env, ctx)?;
                if env.message_id != *message_id || env.to != *to {
                    return Err(RelayError::invalid_params("a sent record or delivery of another message"));
                }
            }
            if send_entry(message_id)?.is_some() {
                return Ok((vec![], None));
            }
            let created_at = envelopes_of(record.as_deref(), item.deliver.as_deref()).map(|e| e.created_at).next();
            let sent = restamped_sent(&item.event, next_sequence, created_at, ctx);
            let AccountEvent::MessageSent { accepted_at, deadline, .. } = &sent else { unreachable!() };
            let (accepted_at, deadline) = (*accepted_at, *deadline);
            let mut events = vec![sent];
            match (&item.status, &item.deliver) {
                // Settled in the event itself: its final status came along.
                _ if settled.is_some() => {}
                (Some(s), _) if s.status.is_terminal() => {
                    events.push(AccountEvent::DeliveryUpdated { message_id: message_id.clone(), status: s.clone() });
                }
                // Delivered from here too, under this relay's signature: as
                // `message.send` would, only from a device valid now, and
                // only under a sender route naming this relay (one accepted
                // before this relay became a home: recipients would refuse
                // it `forbidden`, *who may deliver*, ending it `failed`).
                (_, Some(params))
                    if UnixSecs(deadline) > ctx.now
                        && state.device_valid(&params.envelope.from_device_id, ctx.now)
                        && params.sender_route.as_ref().is_some_and(|r| r.lists_relay(&ctx.policy.relay_id)) =>
                {
                    let digest = message_deliver::deliver_digest(params)?;
                    let (accepted_at, deadline) = (UnixSecs(accepted_at), UnixSecs(deadline));
                    let cmd = DeliveryCmd::Forward { params, digest: &digest, accepted_at, deadline };
                    let begun = begin(&cmd, DeliveryCtx { now_ms: ctx.now.millis(), policy: ctx.policy })?;
                    return Ok((events, Some(begun)));
                }
                // Past its deadline, from a device no longer valid here, or
                // no params: the partner's result comes with its status update.
                _ => {}
            }
            events
        }
        AccountEvent::DeliveryUpdated { message_id, status } => {
            let entry = send_entry(message_id)?;
            // A failure there is not one here while this relay delivers
            // the message itself: its own delivery ends it.
            if status.status == Status::Failed && reads.delivery_params(message_id)?.is_some() {
                vec![]
            } else {
                message_send::record_delivery(entry.as_ref(), message_id, status)
            }
        }
        other => return Err(RelayError::invalid_params(format!("{} is not replicated", other.event_type()))),
    };
    Ok((events, None))
}

/// A replicated registration, checked as `account.register` checks one
/// (PROTOCOL §2 *Registration*) but for where and when it was made: signed
/// by the account key for this account, naming a relay of the route it
/// registered (the home it was made at), and issued no later than now plus
/// the clock tolerance. (It may be old: a home added later gets the
/// account's history, its registration included.)
pub fn check_registration(registration: &Wire<Registration>, route: &Wire<Route>, ctx: Ctx) -> Result<(), RelayError> {
    registration.check_signed(route, ctx.policy.max_object_bytes).map_err(|e| match e.code {
        ErrorCode::PayloadTooLarge => e,
        _ => RelayError::forbidden(format!("registration: {}", e.message)),
    })?;
    if !route.lists_relay(&registration.relay_id) {
        return Err(RelayError::forbidden("registration.relay_id is not a relay of the route it registered"));
    }
    if registration.issued_at > ctx.now.plus(ctx.policy.clock_tolerance).0 {
        return Err(RelayError::invalid_params("registration.issued_at is beyond the clock tolerance"));
    }
    Ok(())
}

/// A device certificate from the account's history: signed by the account
/// key and issued no later than now plus the tolerance. It may have
/// expired since (then it is on file, and invalid, as at the other home).
fn check_replicated_certificate(cert: &Wire<DeviceCertificate>, ctx: Ctx) -> Result<(), RelayError> {
    cert.check_signed(ctx.policy.max_object_bytes)?;
    if cert.issued_at > ctx.now.plus(ctx.policy.clock_tolerance).0 {
        return Err(RelayError::invalid_params("device_certificate: issued_at is in the future"));
    }
    Ok(())
}

/// Whether a settings change made at the other home replaces this home's:
/// the later change wins, and at the same second the more private value
/// (`public_discovery: false`), so both homes end with the same settings
/// whatever order the changes cross in. A change without a time (written
/// before changes were timed) applies in stream order, unless this home
/// has a timed one.
fn later_setting(state: &AccountState, public_discovery: bool, at: Option<u64>) -> bool {
    if state.public_discovery == public_discovery {
        return false;
    }
    match at {
        None => state.settings_at == 0,
        Some(at) => (at, !public_discovery) > (state.settings_at, !state.public_discovery),
    }
}

/// The envelopes a sent item carries: its record's, its delivery's.
fn envelopes_of<'a>(
    record: Option<&'a Record>,
    deliver: Option<&'a DeliverParams>,
) -> impl Iterator<Item = &'a Wire<MessageEnvelope>> {
    record.map(|r| &r.envelope).into_iter().chain(deliver.map(|p| &p.envelope))
}

/// A `message_sent` restamped for this home: `created_at` is its
/// envelope's (from its record or its delivery), which its deadline is
/// recomputed from.
fn restamped_sent(event: &AccountEvent, sequence: u64, created_at: Option<u64>, ctx: Ctx) -> AccountEvent {
    let mut event = event.clone();
    if let AccountEvent::MessageSent { record, accepted_at, deadline, retention_until, .. } = &mut event {
        // Without an envelope no delivery begins here from it: its
        // deadline only ever gets shorter (never past retention).
        let (a, d, r) = sent_times(created_at.unwrap_or(*accepted_at), *accepted_at, ctx);
        (*accepted_at, *retention_until) = (a, r);
        *deadline = if created_at.is_some() { d } else { (*deadline).min(d) };
        if let Some(rec) = record {
            (rec.sequence, rec.expires_at) = (sequence, r);
        }
    }
    event
}

/// A received or self-delivered record's event renumbered for this home,
/// its times as this relay fixes them ([`sent_times`]): `accepted_at` no
/// later than now plus the tolerance, retention from this relay's limits.
fn restamped(event: &AccountEvent, sequence: u64, ctx: Ctx) -> AccountEvent {
    let mut event = event.clone();
    match &mut event {
        AccountEvent::SelfDelivered { record, accepted_at, retention_until, .. }
        | AccountEvent::MessageReceived { record, accepted_at, retention_until, .. } => {
            let (a, _, r) = sent_times(record.envelope.created_at, *accepted_at, ctx);
            (*accepted_at, *retention_until) = (a, r);
            (record.sequence, record.expires_at) = (sequence, r);
        }
        _ => {}
    }
    event
}

#[cfg(test)]
mod tests {
    //! `timeline.replicate` between an account's two home relays (PROTOCOL §5,
    //! SHiNE `DmSyncBatch`): serving pages with acknowledgements at one home
    //! (here `relay-a`), applying them at the other (`relay-b`).

    use super::*;
    use crate::account::method::timeline_replicate::{self as replica, Applied, Item, Page};
    use crate::account::testkit::*;
    use relay_schemas::methods::ReplicateParams;
    use relay_schemas::UnixMillis;

    const OTHER: &str = "relay-b";

    static POLICY_B: LazyLock<Policy> = LazyLock::new(|| Policy::with_relay_id(OTHER));

    /// Decisions at the other home.
    fn at_b(now: u64) -> Ctx<'static> {
        Ctx::new(UnixSecs(now), &POLICY_B)
    }

    /// Alice with two homes (this relay and `relay-b`), her phone and laptop.
    fn at_a() -> Given {
        let registered = registered_with(&alice(), &register_value(&alice(), &phone(), &[RELAY, OTHER], None));
        given(&alice(), &[registered, device_added(&alice(), &laptop())])
    }

    fn replicate(
        s: &Given,
        peer: &str,
        after: u64,
        limit: u32,
        ack: Option<u64>,
    ) -> Result<(Vec<AccountEvent>, Page), RelayError> {
        let p = ReplicateParams { account_id: alice().id, after, limit, ack, notify: false };
        replica::serve(s, peer, &p, s, at(NOW))
    }

    /// Serves `relay-b` and keeps what serving wrote.
    fn serve(s: &mut Given, after: u64, ack: Option<u64>) -> Page {
        let (events, page) = replicate(s, OTHER, after, 100, ack).unwrap();
        events.iter().for_each(|e| s.apply(e));
        page
    }

    fn seqs(page: &Page) -> Vec<u64> {
        page.items.iter().map(|i| i.sequence).collect()
    }

    /// `relay-b` applies a page pulled from this relay.
    fn pull(b: &Given, page: &Page, now: u64) -> Applied {
        replica::apply(b, RELAY, page, None, &[], b, at_b(now)).unwrap()
    }

    /// `relay-b` with everything `a` has, pulled and applied (and `a` having
    /// served it).
    fn other_home_of(a: &mut Given) -> Given {
        let applied = pull(&Given::new(&alice().id), &serve(a, 0, None), NOW);
        given(&alice(), &applied.events)
    }

    fn replicated(applied: &Applied) -> Vec<&AccountEvent> {
        applied
            .events
            .iter()
            .filter_map(|e| match e {
                AccountEvent::Replicated { event, .. } => Some(&**event),
                _ => None,
            })
            .collect()
    }

    /// The page `a` would serve from the start, whoever asks (its items and
    /// route as they are).
    fn history_page(a: &Given) -> Page {
        let items = a.events.iter().zip(1..).map(|(e, sequence)| Item {
            sequence,
            event: e.clone(),
            status: None,
            deliver: None,
        });
        Page { items: items.collect(), next: a.events.len() as u64, has_more: false, route: a.route().cloned() }
    }

    /// `public_discovery` set to `on` at `t` (as `account.settings.update` writes it).
    fn discovery_at(on: bool, t: u64) -> AccountEvent {
        AccountEvent::SettingsUpdated { public_discovery: on, at: Some(t) }
    }

    // ---- a partner's items are claims (PROTOCOL §5 *What a partner home may replicate*) ----

    /// `a`'s next page for `b` (after what `b` pulled), with `edit` applied to
    /// its last item's event: what a hostile partner would serve.
    fn hostile_page(a: &mut Given, b: &Given, edit: impl FnOnce(&mut Item)) -> Page {
        let pulled = b.replica(RELAY).pulled;
        let mut page = serve(a, pulled, Some(pulled));
        edit(page.items.last_mut().expect("an item to edit"));
        page
    }

    fn record_mut(event: &mut AccountEvent) -> &mut Record {
        match event {
            AccountEvent::MessageReceived { record, .. } | AccountEvent::SelfDelivered { record, .. } => record,
            AccountEvent::MessageSent { record: Some(record), .. } => record,
            e => panic!("no record in {e:?}"),
        }
    }

    /// A page with a settings change, then `a`'s received record from bob.
    fn settings_then_received(a: &mut Given) -> Given {
        let b = other_home_of(a);
        a.apply(&discovery_at(true, NOW));
        let received = receive_event(a, &bob_to_alice(1));
        a.apply(&received);
        b
    }

    /// Refused, and nothing of the page is applied (not the settings change
    /// before the bad item either).
    fn then_page_refused(b: &Given, page: &Page, now: u64, code: ErrorCode) -> RelayError {
        assert!(page.items.len() >= 2, "a page with a good item before the bad one");
        then_error(replica::apply(b, RELAY, page, None, &[], b, at_b(now)), code)
    }

    /// Alice's laptop → Bob, delivering at `a`, as `a` serves it.
    fn laptop_send_delivering(a: &mut Given, created_at: u64) -> crate::account::method::timeline_replicate::Item {
        let v = send_value(envelope(&laptop(), &alice(), &bob(), 1, created_at), &["bob-phone"], Some(&["phone"]));
        let sent = then_sent(when_send(a, "laptop", &v, at(created_at.max(NOW))));
        a.apply(&sent.event);
        a.deliveries.insert(mid(1), sent.deliver.clone());
        let (_, page) = replicate(a, OTHER, 0, 100, None).unwrap();
        page.items.into_iter().last().unwrap()
    }

    // ---- serving ------------------------------------------------------------------

    #[test]
    fn replicate_is_answered_only_to_the_accounts_other_home_relay() {
        let a = at_a();
        then_route_error(replicate(&a, "relay-c", 0, 100, None), &route(&alice(), 1, &[RELAY, OTHER]));
        then_route_error(replicate(&given_alice([]), OTHER, 0, 100, None), &route(&alice(), 1, &[RELAY]));
        then_error(replicate(&a, RELAY, 0, 100, None), ErrorCode::Forbidden);
        then_error(replicate(&Given::new(&alice().id), OTHER, 0, 100, None), ErrorCode::NotFound);
        assert!(replicate(&a, OTHER, 0, 100, None).is_ok());
    }

    #[test]
    fn an_item_is_marked_synced_only_after_the_partner_acknowledges_it() {
        let mut a = at_a();
        let (events, page) = replicate(&a, OTHER, 0, 100, None).unwrap();
        assert_eq!((seqs(&page), page.next, page.has_more), (vec![1, 2], 2, false));
        assert!(matches!(&events[..], [AccountEvent::ReplicaServed { through: 2, .. }]), "{events:?}");
        events.iter().for_each(|e| a.apply(e));
        assert_eq!(a.replica(OTHER).acked, 0, "sent is not synced");

        let (events, page) = replicate(&a, OTHER, 2, 100, Some(2)).unwrap();
        assert!(page.items.is_empty());
        assert!(matches!(&events[..], [AccountEvent::ReplicaAcked { through: 2, .. }]), "{events:?}");
        events.iter().for_each(|e| a.apply(e));
        assert_eq!(a.replica(OTHER).acked, 2);
        let (events, _) = replicate(&a, OTHER, 2, 100, Some(2)).unwrap();
        assert!(events.is_empty(), "polling an idle account writes nothing: {events:?}");
    }

    #[test]
    fn an_ack_never_marks_more_than_was_sent() {
        let a = at_a();
        let (events, page) = replicate(&a, OTHER, 9, 100, Some(9)).unwrap();
        assert!(!events.iter().any(|e| matches!(e, AccountEvent::ReplicaAcked { .. })), "{events:?}");
        assert_eq!(seqs(&page), [1, 2], "nothing was acknowledged, so everything is offered");
    }

    #[test]
    fn unacknowledged_items_come_again_after_a_disconnect() {
        let mut a = at_a();
        let first = serve(&mut a, 0, None);
        // The page was lost on the way: the partner asks again from where it stood.
        let (_, again) = replicate(&a, OTHER, 0, 100, Some(0)).unwrap();
        assert_eq!(seqs(&again), seqs(&first));
    }

    #[test]
    fn items_received_from_the_partner_are_never_offered_back() {
        let mut a = at_a();
        let from_b =
            AccountEvent::Replicated { partner: OTHER.into(), origin_seq: 7, event: Box::new(public_discovery(true)) };
        a.apply(&from_b);
        a.apply(&AccountEvent::CursorMoved { device_id: "phone".into(), through: 0 });
        let (_, page) = replicate(&a, OTHER, 0, 100, None).unwrap();
        assert_eq!(seqs(&page), [1, 2]);
        assert_eq!(page.next, 4, "the cursor passes what is not offered");
    }

    #[test]
    fn settings_and_devices_come_before_messages_in_a_page() {
        let mut a = at_a();
        let received = receive_event(&a, &bob_to_alice(1));
        a.apply(&received);
        a.apply(&public_discovery(true));
        let (_, page) = replicate(&a, OTHER, 0, 100, None).unwrap();
        assert_eq!(seqs(&page), [1, 2, 4, 3]);
    }

    #[test]
    fn a_page_holds_at_most_limit_items_and_says_more_is_waiting() {
        let mut a = at_a();
        for n in 1..=3 {
            let received = receive_event(&a, &bob_to_alice(n));
            a.apply(&received);
        }
        let mut page_after = |after: u64, ack: Option<u64>| {
            let (events, page) = replicate(&a, OTHER, after, 2, ack).unwrap();
            events.iter().for_each(|e| a.apply(e));
            (seqs(&page), page.next, page.has_more)
        };
        assert_eq!(page_after(0, None), (vec![1, 2], 2, true));
        assert_eq!(page_after(2, None), (vec![1, 2], 2, true), "a page not acknowledged comes again");
        assert_eq!(page_after(2, Some(2)), (vec![3, 4], 4, true));
        // (Serving wrote its own marks after event 5: the cursor passes them.)
        let (items, next, has_more) = page_after(4, Some(4));
        assert_eq!((items, has_more), (vec![5], false));
        assert!(next > 5, "the cursor passes the marks written so far");
    }

    #[test]
    fn a_page_stays_under_the_byte_cap_but_always_takes_its_first_item() {
        let a = at_a();
        let small = Policy { max_page_bytes: 10, ..Policy::with_relay_id(RELAY) };
        let p = ReplicateParams { account_id: alice().id, after: 0, limit: 100, ack: None, notify: false };
        let (_, page) = replica::serve(&a, OTHER, &p, &a, under(&small, NOW)).unwrap();
        assert_eq!((seqs(&page), page.next, page.has_more), (vec![1], 1, true));
    }

    #[test]
    fn replicate_refuses_a_page_size_outside_the_protocol_bounds() {
        let a = at_a();
        then_error(replicate(&a, OTHER, 0, 0, None), ErrorCode::InvalidParams);
        then_error(replicate(&a, OTHER, 0, 501, None), ErrorCode::InvalidParams);
    }

    #[test]
    fn a_reset_offers_the_whole_history_again() {
        let mut a = at_a();
        serve(&mut a, 0, None);
        serve(&mut a, 2, Some(2));
        assert_eq!(a.replica(OTHER).acked, 2);
        a.apply(&AccountEvent::ReplicaReset { partner: OTHER.into() });
        let (events, page) = replicate(&a, OTHER, 2, 100, Some(2)).unwrap();
        assert_eq!(seqs(&page), [1, 2]);
        assert!(!events.iter().any(|e| matches!(e, AccountEvent::ReplicaAcked { .. })), "{events:?}");
    }

    // ---- applying at the other home ------------------------------------------------

    #[test]
    fn a_replicated_registration_makes_the_account_at_the_other_home() {
        let b = other_home_of(&mut at_a());
        assert!(b.is_registered());
        assert!(b.device_valid("laptop", UnixSecs(NOW)));
        assert_eq!(b.replica(RELAY).pulled, 2);
        assert!(b.events[..2]
            .iter()
            .all(|e| matches!(e, AccountEvent::Replicated { partner, .. } if partner == RELAY)));
    }

    /// Found by relay-sim: the client added the laptop at both homes and
    /// revoked it at `relay-b` before `relay-b` pulled `a`'s add. The add is
    /// known there (the same certificate is on file): before, it was decided
    /// as a new `device.add` of a revoked id, refused, and the refusal took
    /// the whole page, so nothing of `a` ever reached `relay-b` again.
    #[test]
    fn a_replicated_device_add_of_a_certificate_held_here_is_known_even_once_revoked() {
        let a = at_a();
        let b_history = [
            registered_with(&alice(), &register_value(&alice(), &phone(), &[RELAY, OTHER], None)),
            device_added(&alice(), &laptop()),
            device_revoked(&alice(), "laptop"),
        ];
        let b = given(&alice(), &b_history);
        let applied = replica::apply(&b, RELAY, &history_page(&a), None, &[], &b, at_b(NOW)).unwrap();
        assert!(replicated(&applied).is_empty(), "nothing new: {:?}", applied.events);
        assert!(matches!(applied.events[..], [AccountEvent::ReplicaPulled { through: 2, .. }]), "{:?}", applied.events);
        // Another certificate under the revoked id is still refused.
        let mut page = history_page(&a);
        page.items[1].event = device_added_cert(&cert(&alice(), &Device::from_seed("laptop", [13; 32])));
        then_error(replica::apply(&b, RELAY, &page, None, &[], &b, at_b(NOW)), ErrorCode::Forbidden);
    }

    #[test]
    fn a_page_whose_route_does_not_name_this_relay_brings_nothing() {
        let single = given_alice([]);
        let b = Given::new(&alice().id);
        let r = replica::apply(&b, RELAY, &history_page(&single), None, &[], &b, at_b(NOW));
        then_route_error(r, &route(&alice(), 1, &[RELAY]));
        let without_route = Page { route: None, ..history_page(&single) };
        then_error(replica::apply(&b, RELAY, &without_route, None, &[], &b, at_b(NOW)), ErrorCode::Forbidden);
    }

    #[test]
    fn a_page_older_than_a_route_known_here_brings_nothing() {
        let page = history_page(&at_a());
        let b = Given::new(&alice().id);
        let newer = wire(&route(&alice(), 3, &[RELAY]));
        let e = then_rejected(replica::apply(&b, RELAY, &page, Some(&newer), &[], &b, at_b(NOW)));
        assert_eq!(e.code, ErrorCode::RouteStale);
    }

    #[test]
    fn an_account_arrives_only_with_the_account_keys_signed_registration() {
        let a = at_a();
        let mut page = history_page(&a);
        if let AccountEvent::Registered { registration, .. } = &mut page.items[0].event {
            *registration = None;
        }
        let b = Given::new(&alice().id);
        then_error(replica::apply(&b, RELAY, &page, None, &[], &b, at_b(NOW)), ErrorCode::Forbidden);
    }

    #[test]
    fn a_home_added_by_a_route_update_gets_the_account() {
        let mut a = given_alice([route_updated(&route(&alice(), 2, &[RELAY, OTHER]))]);
        let page = serve(&mut a, 0, None);
        let applied = pull(&Given::new(&alice().id), &page, NOW);
        let b = given(&alice(), &applied.events);
        assert_eq!(b.route().map(|r| r.revision), Some(2));
        assert!(b.device_valid("laptop", UnixSecs(NOW)));
    }

    #[test]
    fn a_revocation_from_the_other_home_ends_the_device_here() {
        let mut a = at_a();
        let b = other_home_of(&mut a);
        a.apply(&device_revoked(&alice(), "laptop"));
        let page = serve(&mut a, 2, Some(2));
        let cmd = crate::account::command::AccountCmd::<()>::ReplicaApply {
            partner: RELAY.into(),
            page: Box::new(page),
            known: None,
            senders: vec![],
        };
        let d = crate::account::command::decide(&b, &mut Default::default(), &cmd, &b, at_b(NOW)).unwrap();
        assert!(
            d.effects.iter().any(
                |e| matches!(e, crate::account::decision::Effect::EndDevice { device_id } if device_id == "laptop")
            ),
            "{:?}",
            d.effects
        );
    }

    #[test]
    fn a_partner_the_route_does_not_name_may_not_replicate_into_an_account() {
        let b = other_home_of(&mut at_a());
        let r = replica::apply(&b, "relay-c", &Page::default(), None, &[], &b, at_b(NOW));
        then_route_error(r, &route(&alice(), 1, &[RELAY, OTHER]));
    }

    #[test]
    fn a_message_both_homes_accepted_keeps_one_record() {
        let mut a = at_a();
        let mut b = other_home_of(&mut a);
        let at_a_too = receive_event(&a, &bob_to_alice(1));
        a.apply(&at_a_too);
        let (here, _) = then_accepted(when_receive(&b, &bob_to_alice(1), at_b(NOW)));
        b.apply(&here);
        let page = serve(&mut a, 2, Some(2));
        assert!(matches!(&page.items[..], [Item { event: AccountEvent::MessageReceived { .. }, .. }]), "{page:?}");
        let applied = pull(&b, &page, NOW);
        assert!(replicated(&applied).is_empty(), "{:?}", applied.events);
    }

    #[test]
    fn a_replicated_record_takes_the_next_sequence_of_this_home() {
        let mut a = at_a();
        let mut b = other_home_of(&mut a);
        let (own, _) = then_accepted(when_receive(&b, &bob_to_alice(1), at_b(NOW)));
        b.apply(&own);
        let from_a = receive_event(&a, &bob_to_alice(2));
        a.apply(&from_a);
        assert_eq!(record_of(&from_a).sequence, 1);
        let applied = pull(&b, &serve(&mut a, 2, Some(2)), NOW);
        let [record] = &replicated(&applied)[..] else { panic!("{:?}", applied.events) };
        assert_eq!(record_of(record).sequence, 2);
        assert_eq!(record_of(record).envelope, record_of(&from_a).envelope);
    }

    #[test]
    fn a_send_still_delivering_is_delivered_from_the_other_home_with_its_original_deadline() {
        let mut a = at_a();
        let b = other_home_of(&mut a);
        let sent = then_sent(when_send(&a, "phone", &alice_to_bob(1), at(NOW)));
        a.apply(&sent.event);
        a.deliveries.insert(mid(1), sent.deliver.clone());
        let page = serve(&mut a, 2, Some(2));
        let item = &page.items[0];
        assert_eq!(item.status.as_ref().map(|s| s.status), Some(Status::Delivering));
        assert!(item.deliver.is_some());

        let applied = pull(&b, &page, NOW + 5);
        let [begun] = &applied.forwarded[..] else { panic!("one delivery: {:?}", applied.forwarded) };
        assert_eq!(begun.state.accepted_at, UnixSecs(NOW));
        assert_eq!(begun.state.deadline, UnixSecs(sent.deadline), "the fixed deadline, not a new one");
        let after_first = UnixMillis((NOW + 30) * 1000);
        assert_eq!(begun.due_ms, Some(after_first), "the partner made the first attempt: the next slot is this home's");
        let b = given(&alice(), &applied.events);
        assert_eq!(b.sent(&mid(1)).status, DeliveryStatus::delivering(NOW));
    }

    /// Found by relay-sim: a home added by a route update took on the
    /// deliveries of messages accepted before it was a home. Their params name
    /// the route they were accepted under, which does not list it, so every
    /// recipient refused its attempts `forbidden` (*who may deliver*): a
    /// defined error, which ended its delivery `failed` and left that status
    /// in its ledger for good, while the accepting home delivered the message.
    #[test]
    fn a_send_whose_sender_route_does_not_name_this_home_is_not_delivered_from_here() {
        let mut a = given_alice([]);
        let sent = then_sent(when_send(&a, "phone", &alice_to_bob(1), at(NOW)));
        a.apply(&sent.event);
        a.deliveries.insert(mid(1), sent.deliver.clone());
        a.apply(&route_updated(&route(&alice(), 2, &[RELAY, OTHER])));
        let page = serve(&mut a, 0, None);
        let applied = pull(&Given::new(&alice().id), &page, NOW + 5);
        assert!(applied.forwarded.is_empty(), "not deliverable under this relay's name: {:?}", applied.forwarded);
        let b = given(&alice(), &applied.events);
        assert_eq!(b.sent(&mid(1)).status, DeliveryStatus::delivering(NOW), "kept, its result to come from `a`");
    }

    #[test]
    fn a_send_the_partner_settled_takes_its_status_and_begins_no_delivery() {
        let mut a = at_a();
        let b = other_home_of(&mut a);
        let sent = send_event(&a, &alice_to_bob(1));
        a.apply(&sent);
        let done = when_record_delivery(&a, &mid(1), &DeliveryStatus::target_accepted(NOW));
        done.iter().for_each(|e| a.apply(e));
        let applied = pull(&b, &serve(&mut a, 2, Some(2)), NOW);
        assert!(applied.forwarded.is_empty());
        let b = given(&alice(), &[b.events.clone(), applied.events].concat());
        assert_eq!(b.sent(&mid(1)).status, DeliveryStatus::target_accepted(NOW));
    }

    #[test]
    fn a_send_settled_at_acceptance_replicates_as_its_one_event_with_its_status() {
        let mut a = at_a();
        let b = other_home_of(&mut a);
        let sent = send_event(&a, &alice_to_bob(1));
        let settled = DeliveryStatus::target_accepted(NOW);
        let Ok(SettleDecision::Settled { events, .. }) = settle(&a.state, None, &sent, &settled, at(NOW)) else {
            panic!("expected the send settled")
        };
        events.iter().for_each(|e| a.apply(e));
        let applied = pull(&b, &serve(&mut a, 2, Some(2)), NOW);
        assert!(applied.forwarded.is_empty());
        let came = replicated(&applied);
        assert!(
            matches!(came[..], [AccountEvent::MessageSent { status: Some(ref st), .. }] if *st == settled),
            "one event, no status update after it: {came:?}"
        );
        let b = given(&alice(), &[b.events.clone(), applied.events].concat());
        assert_eq!(b.sent(&mid(1)).status, settled);
    }

    #[test]
    fn a_partners_failure_is_not_taken_while_this_home_delivers_the_message_itself() {
        let mut a = at_a();
        let mut b = other_home_of(&mut a);
        let sent = then_sent(when_send(&a, "phone", &alice_to_bob(1), at(NOW)));
        a.apply(&sent.event);
        a.deliveries.insert(mid(1), sent.deliver.clone());
        let applied = pull(&b, &serve(&mut a, 2, Some(2)), NOW);
        applied.events.iter().for_each(|e| b.apply(e));
        b.deliveries.insert(mid(1), sent.deliver);
        let failed = DeliveryStatus::failed(NOW, RelayError::new(ErrorCode::MessageExpired, "deadline"));
        when_record_delivery(&a, &mid(1), &failed).iter().for_each(|e| a.apply(e));
        let applied = pull(&b, &serve(&mut a, 3, Some(3)), NOW);
        assert!(replicated(&applied).is_empty(), "{:?}", applied.events);
    }

    #[test]
    fn history_offered_again_after_a_reset_writes_nothing_and_delivers_nothing() {
        let mut a = at_a();
        let received = receive_event(&a, &bob_to_alice(1));
        a.apply(&received);
        let sent = then_sent(when_send(&a, "phone", &alice_to_bob(2), at(NOW)));
        a.apply(&sent.event);
        a.deliveries.insert(mid(2), sent.deliver.clone());
        let mut b = Given::new(&alice().id);
        pull(&b.clone(), &serve(&mut a, 0, None), NOW).events.iter().for_each(|e| b.apply(e));
        b.deliveries.insert(mid(2), sent.deliver);
        a.apply(&AccountEvent::ReplicaReset { partner: OTHER.into() });
        let again = serve(&mut a, 4, Some(4));
        assert_eq!(seqs(&again), [1, 2, 3, 4]);
        let applied = pull(&b, &again, NOW);
        assert!(replicated(&applied).is_empty() && applied.forwarded.is_empty(), "{applied:?}");
    }

    #[test]
    fn registering_at_the_other_home_after_replication_changes_nothing() {
        let b = other_home_of(&mut at_a());
        let v = json!({"route": route(&alice(), 1, &[RELAY, OTHER]), "device_certificate": cert(&alice(), &phone()),
                       "registration": alice().registration(OTHER, false, NOW)});
        then_no_events(register(&b, &parse(&v), &digest(&v), None, at_b(NOW)));
        let other_device = json!({"route": route(&alice(), 1, &[RELAY, OTHER]),
            "device_certificate": cert(&alice(), &tablet()), "registration": alice().registration(OTHER, false, NOW)});
        then_error(
            register(&b, &parse(&other_device), &digest(&other_device), None, at_b(NOW)),
            ErrorCode::StateConflict,
        );
    }

    #[test]
    fn a_partner_the_account_left_learns_the_move_from_route_stale() {
        let mut a = at_a();
        let b = other_home_of(&mut a);
        let moved = route(&alice(), 2, &[RELAY]);
        a.apply(&route_updated(&moved));
        let e = then_rejected(replicate(&a, OTHER, 2, 100, Some(2)));
        assert_eq!(e.code, ErrorCode::RouteStale);
        let learned = replica::moved(&b, RELAY, &wire(&moved), at_b(NOW));
        let b = given(&alice(), &[b.events.clone(), learned].concat());
        assert_eq!(b.route().map(|r| r.revision), Some(2));
        assert!(
            replica::moved(&b, RELAY, &wire(&route(&alice(), 1, &[RELAY, OTHER])), at_b(NOW)).is_empty(),
            "never back"
        );
    }

    #[test]
    fn a_relay_the_account_left_opens_no_new_session() {
        let mut a = at_a();
        let b = other_home_of(&mut a);
        let learned = replica::moved(&b, RELAY, &wire(&route(&alice(), 2, &[RELAY])), at_b(NOW));
        let b = given(&alice(), &[b.events.clone(), learned].concat());
        let mut challenges = crate::account::session::Challenges::default();
        let e = then_rejected(challenges.issue(&b, "phone", [7; 32], at_b(NOW)));
        assert_eq!(e.code, ErrorCode::RouteStale);
    }

    #[test]
    fn a_deliver_reaching_the_other_home_after_replication_answers_the_original_result() {
        let mut a = at_a();
        let b = other_home_of(&mut a);
        let (received, original) = then_accepted(when_receive(&a, &bob_to_alice(1), at(NOW + 3)));
        a.apply(&received);
        let applied = pull(&b, &serve(&mut a, 2, Some(2)), NOW + 5);
        let b = given(&alice(), &[b.events.clone(), applied.events].concat());
        let again = then_receive_duplicate(when_receive(&b, &bob_to_alice(1), at_b(NOW + 9)));
        assert_eq!(again, original, "the first home's result, accepted_at included");
    }

    #[test]
    fn account_objects_made_at_one_home_hold_at_the_other() {
        let mut a = at_a();
        let b = other_home_of(&mut a);
        let two_homes_2 = route(&alice(), 2, &[RELAY, OTHER]);
        for e in [
            device_added(&alice(), &tablet()),
            device_revoked(&alice(), "laptop"),
            public_discovery(true),
            contact_revoked("grant", "grant-bob"),
            route_updated(&two_homes_2),
        ] {
            a.apply(&e);
        }
        let applied = pull(&b, &serve(&mut a, 2, Some(2)), NOW);
        let b = given(&alice(), &[b.events.clone(), applied.events].concat());
        assert!(b.device_valid("tablet", UnixSecs(NOW)));
        assert!(!b.device_valid("laptop", UnixSecs(NOW)), "a revocation made at one home holds at the other");
        assert!(b.public_discovery);
        assert!(b.revoked_contacts().contains("grant:grant-bob"));
        assert_eq!(b.route().map(|r| r.revision), Some(2));
    }

    #[test]
    fn a_long_run_of_events_not_offered_is_passed_page_by_page() {
        let mut a = at_a();
        serve(&mut a, 0, None);
        serve(&mut a, 2, Some(2));
        for through in 0..replica::SCAN_PER_PAGE as u64 + 10 {
            a.apply(&AccountEvent::CursorMoved { device_id: "phone".into(), through });
        }
        a.apply(&public_discovery(true));
        let mut after = 2;
        for _ in 0..3 {
            let (events, page) = replicate(&a, OTHER, after, 100, Some(after)).unwrap();
            events.iter().for_each(|e| a.apply(e));
            if let [item] = &page.items[..] {
                assert!(matches!(item.event, AccountEvent::SettingsUpdated { .. }));
                return;
            }
            assert!(page.has_more && page.next > after, "the cursor moves on: {after} -> {}", page.next);
            after = page.next;
        }
        panic!("the offered event after the run never came");
    }

    #[test]
    fn a_reset_brings_back_nothing_changed_since_at_the_other_home() {
        let mut a = at_a();
        a.apply(&public_discovery(true));
        let mut b = other_home_of(&mut a);
        b.apply(&public_discovery(false));
        a.apply(&AccountEvent::ReplicaReset { partner: OTHER.into() });
        let pulled = b.replica(RELAY).pulled;
        let again = serve(&mut a, pulled, Some(pulled));
        assert!(!again.items.is_empty(), "history offered again");
        let applied = pull(&b, &again, NOW);
        assert!(replicated(&applied).is_empty(), "items this home passed already are known: {:?}", applied.events);
    }

    #[test]
    fn settings_changed_at_both_homes_apart_end_the_same_at_both_the_later_winning() {
        for (a_change, b_change, expected) in [
            (discovery_at(true, NOW + 1), discovery_at(false, NOW + 2), false),
            (discovery_at(false, NOW + 2), discovery_at(true, NOW + 1), false),
            (discovery_at(true, NOW + 2), discovery_at(false, NOW + 1), true),
            // The same second: the more private value, at both.
            (discovery_at(true, NOW + 1), discovery_at(false, NOW + 1), false),
        ] {
            let mut a = at_a();
            let mut b = other_home_of(&mut a);
            a.apply(&a_change);
            b.apply(&b_change);
            // They meet again: each pulls the other's news.
            let to_b = serve(&mut a, 2, Some(2));
            let b_page = {
                let p = ReplicateParams { account_id: alice().id, after: 0, limit: 100, ack: None, notify: false };
                replica::serve(&b, RELAY, &p, &b, at_b(NOW)).unwrap().1
            };
            let at_b_now = pull(&b, &to_b, NOW + 3);
            let at_a_now = replica::apply(&a, OTHER, &b_page, None, &[], &a, at(NOW + 3)).unwrap();
            let b = given(&alice(), &[b.events.clone(), at_b_now.events].concat());
            let a = given(&alice(), &[a.events.clone(), at_a_now.events].concat());
            assert_eq!((a.public_discovery, b.public_discovery), (expected, expected), "{a_change:?} / {b_change:?}");
        }
    }

    #[test]
    fn an_untimed_setting_from_before_still_replicates_in_stream_order() {
        let mut a = at_a();
        a.apply(&public_discovery(true));
        let b = other_home_of(&mut a);
        assert!(b.public_discovery);
    }

    // ---- this home's bounds (PROTOCOL §1) ------------------------------------------

    /// A page is refused whole (PROTOCOL §5): an item past this home's bounds
    /// applies nothing, and the partner's cursor stays where it was.
    #[test]
    fn devices_replicated_past_this_homes_max_devices_refuse_the_page() {
        // Alice has three devices at a; b allows two.
        let mut a = at_a();
        a.apply(&device_added(&alice(), &tablet()));
        let policy_b = Policy { max_devices: 2, ..Policy::with_relay_id(OTHER) };
        let page = serve(&mut a, 0, None);
        let b = Given::new(&alice().id);
        let e = replica::apply(&b, RELAY, &page, None, &[], &b, under(&policy_b, NOW)).unwrap_err();
        assert_eq!(e.code, ErrorCode::PayloadTooLarge);
        assert_eq!(e.data.as_ref().unwrap()["limit"], "limits.max_devices");
        // The same page under a's own bound applies.
        let applied = replica::apply(&b, RELAY, &page, None, &[], &b, at_b(NOW)).unwrap();
        assert_eq!(given(&alice(), &applied.events).devices.len(), 3);
    }

    #[test]
    fn contact_revocations_replicated_past_this_homes_cap_refuse_the_page() {
        let mut a = at_a();
        for id in ["g1", "g2", "g3"] {
            a.apply(&contact_revoked("grant", id));
        }
        let b = other_home_of(&mut at_a());
        let policy_b = Policy { max_revoked_contacts: 2, ..Policy::with_relay_id(OTHER) };
        let page = serve(&mut a, 2, Some(2));
        let e = replica::apply(&b, RELAY, &page, None, &[], &b, under(&policy_b, NOW)).unwrap_err();
        assert_eq!(e.code, ErrorCode::PayloadTooLarge);
        assert_eq!(e.data.as_ref().unwrap()["limit"], "limits.max_revoked_contacts");
        assert!(b.revoked_contacts().is_empty());
    }

    #[test]
    fn a_replicated_registration_with_an_oversized_certificate_brings_nothing() {
        let padded =
            alice().with_member(Tag::DeviceCertificate, &cert(&alice(), &phone()), "x-pad", json!("a".repeat(20_000)));
        let mut params = register_value(&alice(), &phone(), &[RELAY, OTHER], None);
        params["device_certificate"] = padded;
        // Made at a home with a larger bound; b keeps the default.
        let policy_a = Policy { max_object_bytes: 1 << 20, ..Policy::with_relay_id(RELAY) };
        let p: RegisterParams = parse(&params);
        let events =
            register(&AccountState::new(&alice().id), &p, &digest(&params), None, under(&policy_a, NOW)).unwrap();
        let page = history_page(&given(&alice(), &events));
        let b = Given::new(&alice().id);
        let e = replica::apply(&b, RELAY, &page, None, &[], &b, at_b(NOW)).unwrap_err();
        assert_eq!(e.code, ErrorCode::PayloadTooLarge);
        assert_eq!(e.data.as_ref().unwrap()["limit"], "limits.max_object_bytes");
    }

    #[test]
    fn a_received_record_naming_another_account_as_to_with_a_forged_signature_refuses_the_whole_page() {
        let mut a = at_a();
        let b = settings_then_received(&mut a);
        let page = hostile_page(&mut a, &b, |item| {
            let env = &mut record_mut(&mut item.event).envelope;
            let mut v: Value = serde_json::from_str(env.raw().get()).unwrap();
            v["to"] = json!(carol().id);
            v["signature"] = json!(relay_schemas::encoding::b64_encode(&[0u8; 64]));
            *env = wire(&v);
        });
        then_page_refused(&b, &page, NOW, ErrorCode::Forbidden);
    }

    #[test]
    fn a_received_record_must_verify_under_its_senders_certificate() {
        let mut a = at_a();
        let b = settings_then_received(&mut a);
        // Signed by carol's phone, claimed as bob's.
        let page = hostile_page(&mut a, &b, |item| {
            let forged = envelope(&carol_phone(), &bob(), &alice(), 1, NOW);
            record_mut(&mut item.event).envelope = wire(&forged);
        });
        then_page_refused(&b, &page, NOW, ErrorCode::Forbidden);
    }

    #[test]
    fn a_received_record_without_its_senders_certificate_refuses_the_page() {
        let mut a = at_a();
        let b = settings_then_received(&mut a);
        let page = hostile_page(&mut a, &b, |item| {
            if let AccountEvent::MessageReceived { sender_certificate, .. } = &mut item.event {
                *sender_certificate = None;
            }
        });
        then_page_refused(&b, &page, NOW, ErrorCode::Forbidden);
    }

    #[test]
    fn a_received_record_kept_without_a_certificate_verifies_under_one_from_the_senders_home() {
        let mut a = at_a();
        let b = settings_then_received(&mut a);
        // Accepted before certificates were kept with received records.
        let page = hostile_page(&mut a, &b, |item| {
            if let AccountEvent::MessageReceived { sender_certificate, .. } = &mut item.event {
                *sender_certificate = None;
            }
        });
        let from_bobs_home = [wire(&cert(&bob(), &bob_laptop())), wire(&cert(&bob(), &bob_phone()))];
        let applied = replica::apply(&b, RELAY, &page, None, &from_bobs_home, &b, at_b(NOW)).unwrap();
        assert!(matches!(replicated(&applied)[..], [_, AccountEvent::MessageReceived { .. }]), "{:?}", applied.events);
        // Another account's certificate for that device name proves nothing.
        let carols = [wire(&carol().certificate(&bob_phone(), ISSUED, None))];
        then_error(replica::apply(&b, RELAY, &page, None, &carols, &b, at_b(NOW)), ErrorCode::Forbidden);
    }

    #[test]
    fn a_received_record_checked_and_accepted_keeps_this_homes_times() {
        let mut a = at_a();
        let b = settings_then_received(&mut a);
        let page = hostile_page(&mut a, &b, |item| {
            if let AccountEvent::MessageReceived { accepted_at, retention_until, .. } = &mut item.event {
                (*accepted_at, *retention_until) = (NOW + 1_000_000_000, u64::MAX);
            }
        });
        let applied = pull(&b, &page, NOW);
        let came = replicated(&applied);
        let Some(AccountEvent::MessageReceived { accepted_at, retention_until, .. }) = came.last() else {
            panic!("{came:?}")
        };
        let tolerance = POLICY_B.clock_tolerance;
        assert_eq!((*accepted_at, *retention_until), (NOW + tolerance, NOW + tolerance + retention()));
    }

    #[test]
    fn a_sent_record_must_name_this_account_as_from() {
        let mut a = at_a();
        let b = other_home_of(&mut a);
        a.apply(&discovery_at(true, NOW));
        let sent = send_event(&a, &alice_to_bob(1));
        a.apply(&sent);
        let page = hostile_page(&mut a, &b, |item| {
            record_mut(&mut item.event).envelope = wire(&envelope(&bob_phone(), &bob(), &bob(), 1, NOW));
        });
        then_page_refused(&b, &page, NOW, ErrorCode::Forbidden);
    }

    #[test]
    fn a_sent_record_from_a_device_revoked_here_before_its_created_at_refuses_the_page() {
        let mut a = at_a();
        let mut b = other_home_of(&mut a);
        // This home revoked the laptop (at NOW - 10); the partner has not heard.
        b.apply(&device_revoked(&alice(), "laptop"));
        let sent = laptop_send_delivering(&mut a, NOW);
        let settings = Item { sequence: 90, event: discovery_at(true, NOW), status: None, deliver: None };
        let page =
            Page { items: vec![settings, Item { sequence: 91, ..sent }], next: 91, has_more: false, route: None };
        let e = then_page_refused(&b, &page, NOW, ErrorCode::Forbidden);
        assert!(e.message.contains("not valid here at created_at"), "{e:?}");
    }

    #[test]
    fn a_sent_message_from_a_device_this_home_learned_was_revoked_before_its_created_at_is_not_offered() {
        let mut a = at_a();
        let mut b = other_home_of(&mut a);
        let revoked = device_revoked(&alice(), "laptop");
        b.apply(&revoked);
        // `a` accepted the laptop's message before it heard of the revocation...
        let sent = laptop_send_delivering(&mut a, NOW);
        let (_, before) = replicate(&a, OTHER, 0, 100, None).unwrap();
        assert!(seqs(&before).contains(&sent.sequence), "offered while `a` knows the laptop valid");
        // ... then pulled it from `b`: the message is no longer offered, the
        // cursor passes it, and `b` takes the page.
        a.apply(&AccountEvent::Replicated { partner: OTHER.into(), origin_seq: 3, event: Box::new(revoked) });
        let (_, page) = replicate(&a, OTHER, 0, 100, None).unwrap();
        assert!(!seqs(&page).contains(&sent.sequence), "{:?}", seqs(&page));
        assert_eq!((page.next, page.has_more), (a.events.len() as u64, false));
        pull(&b, &page, NOW);
    }

    #[test]
    fn a_send_from_a_device_revoked_here_since_is_kept_but_not_delivered_from_here() {
        let mut a = at_a();
        let mut b = other_home_of(&mut a);
        let sent = laptop_send_delivering(&mut a, NOW - 60);
        // Revoked after the message was created (at NOW - 10).
        b.apply(&device_revoked(&alice(), "laptop"));
        let page = Page { items: vec![Item { sequence: 91, ..sent }], next: 91, has_more: false, route: None };
        let applied = pull(&b, &page, NOW);
        assert!(applied.forwarded.is_empty(), "no delivery under this relay's name: {:?}", applied.forwarded);
        assert!(matches!(replicated(&applied)[..], [AccountEvent::MessageSent { .. }]), "{:?}", applied.events);
    }

    #[test]
    fn a_forwarded_deadline_is_recomputed_here_never_taken_from_the_page() {
        let mut a = at_a();
        let b = other_home_of(&mut a);
        let mut sent = laptop_send_delivering(&mut a, NOW - 60);
        if let AccountEvent::MessageSent { deadline, .. } = &mut sent.event {
            *deadline = NOW + 1_000_000_000;
        }
        let page = Page { items: vec![Item { sequence: 91, ..sent }], next: 91, has_more: false, route: None };
        let applied = pull(&b, &page, NOW);
        let [begun] = &applied.forwarded[..] else { panic!("one delivery: {:?}", applied.forwarded) };
        assert_eq!(begun.state.deadline, UnixSecs(NOW - 60 + age_limit()));
        let Some(AccountEvent::MessageSent { deadline, .. }) = replicated(&applied).first().copied() else { panic!() };
        assert_eq!(*deadline, NOW - 60 + age_limit(), "the stored event too");
    }

    #[test]
    fn a_forwarded_delivery_created_beyond_the_clock_tolerance_refuses_the_page() {
        let mut a = at_a();
        let b = other_home_of(&mut a);
        // Created "later" than b's clock allows (a's clock is far ahead).
        let sent = laptop_send_delivering(&mut a, NOW + 3_600);
        let settings = Item { sequence: 90, event: discovery_at(true, NOW), status: None, deliver: None };
        let page =
            Page { items: vec![settings, Item { sequence: 91, ..sent }], next: 91, has_more: false, route: None };
        then_page_refused(&b, &page, NOW, ErrorCode::InvalidParams);
    }

    #[test]
    fn a_replicated_settings_time_is_clamped_to_now_plus_the_clock_tolerance() {
        let mut a = at_a();
        let b = other_home_of(&mut a);
        a.apply(&discovery_at(true, NOW + 1_000_000_000));
        let applied = pull(&b, &serve(&mut a, 2, Some(2)), NOW);
        let b = given(&alice(), &[b.events.clone(), applied.events].concat());
        assert!(b.public_discovery);
        assert_eq!(b.settings_at, NOW + POLICY_B.clock_tolerance);
        // A later real change at the other home still wins here.
        let later = Item { sequence: 95, event: discovery_at(false, NOW + 400), status: None, deliver: None };
        let page = Page { items: vec![later], next: 95, has_more: false, route: None };
        let applied = pull(&b, &page, NOW + 400);
        let b = given(&alice(), &[b.events.clone(), applied.events].concat());
        assert!(!b.public_discovery, "the far-future time pinned nothing");
    }

    #[test]
    fn a_replicated_registration_must_name_a_relay_of_the_route_it_registered() {
        let mut page = history_page(&at_a());
        if let AccountEvent::Registered { registration: Some(r), .. } = &mut page.items[0].event {
            **r = wire(&alice().registration("relay-c", false, NOW));
        }
        let b = Given::new(&alice().id);
        let e = then_error(replica::apply(&b, RELAY, &page, None, &[], &b, at_b(NOW)), ErrorCode::Forbidden);
        assert!(e.message.contains("relay_id"), "{e:?}");
    }

    #[test]
    fn a_replicated_registration_issued_beyond_the_clock_tolerance_is_refused() {
        let mut page = history_page(&at_a());
        if let AccountEvent::Registered { registration: Some(r), .. } = &mut page.items[0].event {
            **r = wire(&alice().registration(RELAY, false, NOW + 3_600));
        }
        let b = Given::new(&alice().id);
        then_error(replica::apply(&b, RELAY, &page, None, &[], &b, at_b(NOW)), ErrorCode::InvalidParams);
    }

    #[test]
    fn history_with_a_device_certificate_expired_since_still_replicates() {
        let old = alice().certificate(&tablet(), ISSUED, Some(NOW + 10));
        let mut a = at_a();
        a.apply(&device_added_cert(&old));
        let applied = pull(&Given::new(&alice().id), &serve(&mut a, 0, None), NOW + 100);
        let b = given(&alice(), &applied.events);
        assert!(b.certificate("tablet").is_some(), "on file, as at the other home");
        assert!(!b.device_valid("tablet", UnixSecs(NOW + 100)));
    }

    #[test]
    fn a_route_revision_older_than_this_homes_in_history_offered_again_is_known() {
        let mut a = at_a();
        a.apply(&route_updated(&route(&alice(), 2, &[RELAY, OTHER])));
        let mut b = other_home_of(&mut a);
        b.apply(&route_updated(&route(&alice(), 3, &[RELAY, OTHER])));
        a.apply(&AccountEvent::ReplicaReset { partner: OTHER.into() });
        let again = serve(&mut a, 3, Some(3));
        let applied = replica::apply(&b, RELAY, &again, None, &[], &b, at_b(NOW)).unwrap();
        assert!(replicated(&applied).is_empty(), "{:?}", applied.events);
    }
}
