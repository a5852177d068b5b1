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
//! ([`decide_forwarded`]).
//!
//! Timeline order both homes agree on: each home numbers its records in
//! the order it stored them (`sequence`, the sync cursor), and a record's
//! place in the conversation is `(envelope.created_at,
//! envelope.message_id)`, the same at both homes.

use super::{contact_revoke, device_add, device_revoke, message_deliver, message_delivery_status, route_update};
use crate::account::command::{Decision, Effect, Reads, Reply};
use crate::account::events::{AccountEvent, Record};
use crate::account::ledger::{Ledger, SendEntry};
use crate::account::shared::{json, not_served_here, Ctx};
use crate::account::state::AccountState;
use crate::account::timeline::fits_page;
use crate::delivery::core::{decide_forwarded, Begun};
use relay_schemas::methods::{DeliverParams, ReplicateParams};
use relay_schemas::objects::{DeviceCertificate, MessageEnvelope, Registration, Route};
use relay_schemas::sign::Tag;
use relay_schemas::{DeliveryStatus, ErrorCode, RelayError, Status, UnixSecs, Wire};
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

/// What the replication commands answer the replicator (never on the wire).
#[derive(Debug)]
pub enum Outcome {
    /// `ReplicaCursor`: this relay's cursor in the partner's stream.
    Cursor(u64),
    /// `ReplicaApply`: how many items wrote something here.
    Applied { items: usize },
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
            if state.certificate(&device_certificate.device_id) == Some(device_certificate) {
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
                    let times = (UnixSecs(accepted_at), UnixSecs(deadline));
                    let begun = decide_forwarded(params.clone(), digest, times, ctx.now.millis(), ctx.policy);
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
                message_delivery_status::record_delivery(entry.as_ref(), message_id, status)
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
