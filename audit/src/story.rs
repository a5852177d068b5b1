//! `relay audit message FROM MESSAGE_ID`: the whole story of one message on
//! this relay, from its events alone.
//!
//! Read, in this order:
//! 1. `account/{from}` (when the sender is at home here): the acceptance
//!    (`message_sent` or `self_delivered`: time, deadline, digest of the
//!    `message.send` params, the sent record) and every status reported to
//!    the sender (`delivery_updated`, or the `status` a `message_sent` settled
//!    at acceptance carries);
//! 2. `delivery/{from}/{message_id}`: the acceptance as the delivery keeps it
//!    (deadline, digest of the `message.deliver` params), every attempt
//!    (time, target relays, route revision, then its failure with the error
//!    and the next due time, or the final status it brought), route
//!    refreshes, and the end;
//! 3. `account/{to}` (the recipient, when at home here): `message_received`,
//!    the record created on the recipient's timeline. When neither 1 nor 2
//!    names the recipient (this relay only received the message) and no
//!    `--to` is given, every account stream is searched (events whose bytes
//!    do not contain the message id are skipped undecoded).
//!
//! Only the events about this message are decoded; a broken event on the
//! way is listed under `problems` (stream, seq, what) and the story goes on.
//! A stream read whose prefix was pruned (PROTOCOL §10) is listed under
//! `pruned` (through which seq, when): the events of the message may have
//! been among those deleted, and a delivery stream deleted whole still
//! tells that the delivery was here.

use super::{fmt_ms, fmt_secs, stream_kind, AuditError, StreamKind};
use relay_actors::store::{Store, StoredEvent};
use relay_actors::upcast;
use relay_core::account::{AccountEvent, Record};
use relay_core::delivery::aggregate::DeliveryEvent;
use relay_schemas::objects::{DeliveryStatus, Status};
use relay_schemas::{AccountId, RelayError, RelayId, UnixMillis, UnixSecs};
use serde::Serialize;
use std::fmt::Write as _;

/// Where an event is: enough to find it again (`relay audit export --stream`).
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct EventRef {
    pub stream: String,
    pub seq: u64,
    #[serde(rename = "type")]
    pub event_type: String,
    /// Unix seconds the event was written.
    pub at: u64,
}

impl EventRef {
    fn of(ev: &StoredEvent) -> Self {
        EventRef { stream: ev.stream.clone(), seq: ev.seq, event_type: ev.event_type.clone(), at: ev.at }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Story {
    pub from: String,
    pub message_id: String,
    /// The recipient account, when some event here names it.
    pub to: Option<String>,
    /// Set when the sender's account (here) accepted the message.
    pub acceptance: Option<Acceptance>,
    /// Set when this relay delivered the message to another account.
    pub delivery: Option<Delivery>,
    /// Statuses reported to the sender's account, in order.
    pub status_reports: Vec<StatusReport>,
    /// The latest status this relay knows for the sender; `None` when this
    /// relay only received the message.
    pub final_status: Option<DeliveryStatus>,
    /// The recipient account(s) here that accepted the message.
    pub receipts: Vec<Receipt>,
    /// Timeline records this message created on this relay.
    pub timeline_records: Vec<TimelineRef>,
    /// The message between an account's two home relays, from this
    /// relay's side (`timeline.replicate`): stored here from the partner,
    /// sent to the partner, acknowledged by it.
    pub replication: Vec<Replication>,
    /// Every event the story was told from, in reading order.
    pub events: Vec<EventRef>,
    /// Events on the way that could not be read or decoded.
    pub problems: Vec<String>,
    /// The streams read whose prefix was deleted by retention.
    pub pruned: Vec<PrunedRef>,
}

/// A stream's pruned marker: its events `1..=through_seq` were deleted at `at`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct PrunedRef {
    pub stream: String,
    pub through_seq: u64,
    /// Unix seconds.
    pub at: u64,
    /// No event of the stream is left (a delivery stream deleted whole).
    pub whole: bool,
}

impl Story {
    /// Whether this relay has any trace of the message (its delivery
    /// stream deleted whole is one).
    pub fn found(&self) -> bool {
        let delivery = relay_actors::delivery::stream_id(&self.from, &self.message_id);
        !self.events.is_empty() || self.pruned.iter().any(|p| p.stream == delivery)
    }

    /// Notes `stream`'s marker, if it has one.
    fn note_pruned(&mut self, store: &Store, stream: &str) {
        match store.pruned(stream) {
            Ok(Some(p)) => {
                let whole = store.read(stream, 0).next().is_none();
                self.pruned.push(PrunedRef { stream: stream.to_owned(), through_seq: p.head.seq, at: p.at, whole })
            }
            Ok(None) => {}
            Err(e) => self.problems.push(e.to_string()),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Acceptance {
    pub accepted_at: u64,
    pub deadline: u64,
    /// `blake3(JCS(message.send params))`: the idempotency key's content.
    pub send_params_digest: String,
    pub retention_until: u64,
    pub self_delivery: bool,
    pub event: EventRef,
}

#[derive(Clone, Debug, Serialize)]
pub struct Delivery {
    pub stream: String,
    pub to: AccountId,
    pub accepted_at: UnixSecs,
    pub deadline: UnixSecs,
    /// `blake3(JCS(message.deliver params))`, the params every attempt sends.
    pub deliver_params_digest: String,
    pub first_due_ms: UnixMillis,
    pub attempts: Vec<Attempt>,
    pub route_refreshes: Vec<RouteRefresh>,
    /// The delivery's terminal status, when it ended.
    pub finished: Option<Finished>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Attempt {
    pub attempt: u32,
    /// Unix seconds the attempt was recorded (before the request went out).
    pub started_at: u64,
    /// Target relay ids (empty when no route was known).
    pub targets: Vec<RelayId>,
    pub route_revision: u64,
    pub outcome: AttemptOutcome,
    pub event: EventRef,
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum AttemptOutcome {
    /// The attempt did not deliver; another is due at `next_due_ms`.
    Failed {
        at: u64,
        error: RelayError,
        next_due_ms: UnixMillis,
        may_switch: bool,
        refresh_route: bool,
        event: EventRef,
    },
    /// The attempt ended the delivery with `status`.
    Finished { at: u64, status: DeliveryStatus, event: EventRef },
    /// No outcome recorded: still in flight when the log ends (the relay
    /// stopped during the attempt; a restart confirms with the same target).
    NoOutcome,
}

#[derive(Clone, Debug, Serialize)]
pub struct RouteRefresh {
    pub at: u64,
    pub revision: u64,
    pub relays: Vec<relay_schemas::objects::RelayRef>,
    pub event: EventRef,
}

#[derive(Clone, Debug, Serialize)]
pub struct Finished {
    pub at: u64,
    pub status: DeliveryStatus,
    /// The attempt whose answer ended it; `None` for the deadline or a
    /// confirmation by the sender's other home relay.
    pub by_attempt: Option<u32>,
    pub event: EventRef,
}

#[derive(Clone, Debug, Serialize)]
pub struct Replication {
    pub account: String,
    pub partner: String,
    /// `received_from_partner` (the event came by `timeline.replicate`),
    /// `sent_to_partner` (a page through it was served), or
    /// `acked_by_partner` (the partner acknowledged storing it).
    pub step: &'static str,
    /// The event's sequence in the stream it was first written to (the
    /// partner's for `received_from_partner`).
    pub origin_seq: u64,
    pub event: EventRef,
}

#[derive(Clone, Debug, Serialize)]
pub struct StatusReport {
    pub at: u64,
    pub status: DeliveryStatus,
    pub event: EventRef,
}

#[derive(Clone, Debug, Serialize)]
pub struct Receipt {
    pub account: String,
    pub accepted_at: u64,
    /// Digest of the `message.deliver` params as received.
    pub digest: String,
    pub retention_until: u64,
    pub event: EventRef,
}

#[derive(Clone, Debug, Serialize)]
pub struct TimelineRef {
    pub account: String,
    pub sequence: u64,
    /// `sent` (the sender's copy) or `received`.
    pub direction: &'static str,
    pub expires_at: u64,
    /// Devices that may read it.
    pub visible: Vec<String>,
    /// Devices with a key box.
    pub boxes: Vec<String>,
    pub event: EventRef,
}

fn timeline_ref(account: &str, record: &Record, direction: &'static str, ev: &StoredEvent) -> TimelineRef {
    TimelineRef {
        account: account.to_owned(),
        sequence: record.sequence,
        direction,
        expires_at: record.expires_at,
        visible: record.visible.clone(),
        boxes: record.boxes.iter().map(|b| b.device_id.clone()).collect(),
        event: EventRef::of(ev),
    }
}

/// Tells the story of `(from, message_id)`; `to` skips the search for the
/// recipient when this relay only received the message.
pub fn message_story(store: &Store, from: &str, message_id: &str, to: Option<&str>) -> Result<Story, AuditError> {
    relay_schemas::ids::check_message_id("MESSAGE_ID", message_id).map_err(|e| AuditError::Usage(e.message))?;
    if from.is_empty() || from.contains('/') {
        return Err(AuditError::Usage(format!("FROM {from:?} is not an account id")));
    }
    let mut story = Story {
        from: from.to_owned(),
        message_id: message_id.to_owned(),
        to: to.map(str::to_owned),
        acceptance: None,
        delivery: None,
        status_reports: vec![],
        final_status: None,
        receipts: vec![],
        timeline_records: vec![],
        replication: vec![],
        events: vec![],
        problems: vec![],
        pruned: vec![],
    };
    // 1. The sender's account.
    let sender = relay_actors::account::stream_id(from);
    story.note_pruned(store, &sender);
    for ev in matching_events(store, &sender, message_id, &mut story.problems) {
        account_event(&mut story, from, &ev);
    }
    // 2. The delivery.
    let stream = relay_actors::delivery::stream_id(from, message_id);
    story.note_pruned(store, &stream);
    for item in store.read(&stream, 0) {
        match item.map_err(|e| e.to_string()).and_then(|ev| {
            let d = upcast::delivery_event(&ev).map_err(|e| e.to_string())?;
            Ok((ev, d))
        }) {
            Ok((ev, d)) => delivery_event(&mut story, &ev, d),
            Err(what) => story.problems.push(what),
        }
    }
    if let Some(d) = &story.delivery {
        if let Some(f) = &d.finished {
            story.final_status = Some(f.status.clone());
        }
        story.to.get_or_insert_with(|| d.to.to_string());
    }
    // 3. The recipient's account (if not the sender itself, already read).
    match story.to.clone() {
        Some(to) if to != from => {
            let stream = relay_actors::account::stream_id(&to);
            story.note_pruned(store, &stream);
            for ev in matching_events(store, &stream, message_id, &mut story.problems) {
                account_event(&mut story, &to, &ev);
            }
        }
        Some(_) => {}
        None => {
            let streams: Vec<String> = store.streams().filter_map(Result::ok).collect();
            for stream in streams {
                let StreamKind::Account { account_id } = stream_kind(&stream) else { continue };
                if account_id == from {
                    continue;
                }
                let account_id = account_id.to_owned();
                for ev in matching_events(store, &stream, message_id, &mut story.problems) {
                    account_event(&mut story, &account_id, &ev);
                }
            }
        }
    }
    if story.to.is_none() {
        story.to = story.receipts.first().map(|r| r.account.clone());
    }
    // 4. Replication of the events written here to the other home.
    let written_here: Vec<EventRef> = story
        .events
        .iter()
        .filter(|e| e.stream.starts_with("account/") && e.event_type != "replicated")
        .cloned()
        .collect();
    for e in written_here {
        let account = e.stream.trim_start_matches("account/").to_owned();
        replication_marks(store, &e.stream, &account, e.seq, &mut story);
    }
    Ok(story)
}

/// Events of `stream` whose bytes mention `message_id` (the rest is not
/// decoded); unreadable records go to `problems`.
fn matching_events(store: &Store, stream: &str, message_id: &str, problems: &mut Vec<String>) -> Vec<StoredEvent> {
    let mut out = vec![];
    for item in store.read(stream, 0) {
        match item {
            Ok(ev) if ev.data.get().contains(message_id) => out.push(ev),
            Ok(_) => {}
            Err(e) => problems.push(e.to_string()),
        }
    }
    out
}

fn account_event(story: &mut Story, account: &str, ev: &StoredEvent) {
    let event = match upcast::account_event(ev) {
        Ok(e) => e,
        Err(e) => return story.problems.push(e.to_string()),
    };
    let (from, mid) = (story.from.clone(), story.message_id.clone());
    let r = EventRef::of(ev);
    match event.origin() {
        AccountEvent::MessageSent {
            message_id,
            to,
            digest,
            accepted_at,
            deadline,
            retention_until,
            record,
            status,
        } if *message_id == mid && account == from => {
            story.acceptance = Some(Acceptance {
                accepted_at: *accepted_at,
                deadline: *deadline,
                send_params_digest: digest.clone(),
                retention_until: *retention_until,
                self_delivery: false,
                event: r.clone(),
            });
            story.to.get_or_insert_with(|| to.clone());
            story.final_status.get_or_insert_with(|| DeliveryStatus::delivering(*accepted_at));
            if let Some(rec) = record {
                story.timeline_records.push(timeline_ref(account, rec, "sent", ev));
            }
            // Settled at acceptance (a local recipient): its outcome is here.
            if let Some(status) = status {
                story.status_reports.push(StatusReport { at: ev.at, status: status.clone(), event: r.clone() });
                story.final_status = Some(status.clone());
            }
        }
        AccountEvent::SelfDelivered { message_id, digest, accepted_at, retention_until, record }
            if *message_id == mid && account == from =>
        {
            story.acceptance = Some(Acceptance {
                accepted_at: *accepted_at,
                deadline: *accepted_at,
                send_params_digest: digest.clone(),
                retention_until: *retention_until,
                self_delivery: true,
                event: r.clone(),
            });
            story.to = Some(from.clone());
            story.final_status = Some(DeliveryStatus::target_accepted(*accepted_at));
            story.timeline_records.push(timeline_ref(account, record, "received", ev));
        }
        AccountEvent::DeliveryUpdated { message_id, status } if *message_id == mid && account == from => {
            story.status_reports.push(StatusReport { at: ev.at, status: status.clone(), event: r.clone() });
            story.final_status = Some(status.clone());
        }
        AccountEvent::MessageReceived {
            from: sender,
            message_id,
            digest,
            accepted_at,
            retention_until,
            record,
            ..
        } if *message_id == mid && *sender == from => {
            story.receipts.push(Receipt {
                account: account.to_owned(),
                accepted_at: *accepted_at,
                digest: digest.clone(),
                retention_until: *retention_until,
                event: r.clone(),
            });
            story.timeline_records.push(timeline_ref(account, record, "received", ev));
        }
        // The id appears in the bytes for another reason (another sender's
        // message with the same id, a ciphertext…): not part of this story.
        _ => return,
    }
    if let AccountEvent::Replicated { partner, origin_seq, .. } = &event {
        let step = "received_from_partner";
        let (partner, origin_seq) = (partner.clone(), *origin_seq);
        story.replication.push(Replication {
            account: account.to_owned(),
            partner,
            step,
            origin_seq,
            event: r.clone(),
        });
    }
    story.events.push(r);
}

/// How this relay's event `seq` of `stream` (written here, not replicated)
/// went to the account's other home: the first page served through it and
/// the first acknowledgement covering it, per partner, since the last reset.
fn replication_marks(store: &Store, stream: &str, account: &str, seq: u64, story: &mut Story) {
    let mut seen: Vec<(String, &'static str)> = Vec::new();
    for item in store.read(stream, seq) {
        let ev = match item {
            Ok(ev) => ev,
            Err(e) => return story.problems.push(e.to_string()),
        };
        if !ev.event_type.starts_with("replica_") {
            continue;
        }
        let (partner, through, step) = match upcast::account_event(&ev) {
            Ok(AccountEvent::ReplicaServed { partner, through }) => (partner, through, "sent_to_partner"),
            Ok(AccountEvent::ReplicaAcked { partner, through }) => (partner, through, "acked_by_partner"),
            Ok(AccountEvent::ReplicaReset { partner }) => {
                seen.retain(|(p, _)| *p != partner);
                continue;
            }
            Ok(_) => continue,
            Err(e) => return story.problems.push(e.to_string()),
        };
        if through < seq || seen.iter().any(|(p, s)| *p == partner && *s == step) {
            continue;
        }
        seen.push((partner.clone(), step));
        let r = EventRef::of(&ev);
        story.replication.push(Replication { account: account.to_owned(), partner, step, origin_seq: seq, event: r });
    }
}

fn delivery_event(story: &mut Story, ev: &StoredEvent, event: DeliveryEvent) {
    let r = EventRef::of(ev);
    story.events.push(r.clone());
    if let DeliveryEvent::Accepted { to, accepted_at, deadline, digest, first_due_ms, .. } = &event {
        story.delivery = Some(Delivery {
            stream: ev.stream.clone(),
            to: to.clone(),
            accepted_at: *accepted_at,
            deadline: *deadline,
            deliver_params_digest: digest.clone(),
            first_due_ms: *first_due_ms,
            attempts: vec![],
            route_refreshes: vec![],
            finished: None,
        });
        return;
    }
    let Some(d) = story.delivery.as_mut() else {
        story.problems.push(format!("stream {:?} seq {}: {} before accepted", ev.stream, ev.seq, ev.event_type));
        return;
    };
    match event {
        DeliveryEvent::Accepted { .. } => {}
        DeliveryEvent::RouteRefreshed { revision, relays } => {
            d.route_refreshes.push(RouteRefresh { at: ev.at, revision, relays, event: r })
        }
        DeliveryEvent::AttemptStarted { attempt, targets, revision } => d.attempts.push(Attempt {
            attempt,
            started_at: ev.at,
            targets,
            route_revision: revision,
            outcome: AttemptOutcome::NoOutcome,
            event: r,
        }),
        DeliveryEvent::AttemptFailed { attempt, error, next_due_ms, may_switch, refresh_route } => {
            let outcome = AttemptOutcome::Failed { at: ev.at, error, next_due_ms, may_switch, refresh_route, event: r };
            match d.attempts.iter_mut().rev().find(|a| a.attempt == attempt) {
                Some(a) => a.outcome = outcome,
                None => story.problems.push(format!(
                    "stream {:?} seq {}: attempt_failed for attempt {attempt}, which never started",
                    ev.stream, ev.seq
                )),
            }
        }
        DeliveryEvent::Finished { status } => {
            let in_flight = d.attempts.last_mut().filter(|a| matches!(a.outcome, AttemptOutcome::NoOutcome));
            let by_attempt = in_flight.map(|a| {
                a.outcome = AttemptOutcome::Finished { at: ev.at, status: status.clone(), event: r.clone() };
                a.attempt
            });
            d.finished = Some(Finished { at: ev.at, status, by_attempt, event: r });
        }
    }
}

fn status_text(s: &DeliveryStatus) -> String {
    let name = match s.status {
        Status::Delivering => "delivering",
        Status::TargetAccepted => "target_accepted",
        Status::Failed => "failed",
    };
    match &s.error {
        Some(e) => format!("{name} ({}: {})", e.code, e.message),
        None => name.to_string(),
    }
}

fn at(r: &EventRef) -> String {
    format!("{} seq {}", r.stream, r.seq)
}

/// The story for people: sections in the order things happened.
pub fn render_text(s: &Story) -> String {
    let mut o = String::new();
    let to = s.to.as_deref().unwrap_or("(unknown recipient)");
    let _ = writeln!(o, "message {} from {} to {}", s.message_id, s.from, to);
    if !s.found() {
        let _ = writeln!(o, "\nno event on this relay mentions this message");
    }
    if !s.pruned.is_empty() {
        let _ = writeln!(o, "\npruned by retention (events deleted, the chain kept by a marker)");
        for p in &s.pruned {
            let what = if p.whole { " (deleted whole)" } else { "" };
            let _ = writeln!(
                o,
                "  {} pruned through seq {} at {}{what}",
                p.stream,
                p.through_seq,
                fmt_secs(UnixSecs(p.at))
            );
        }
    }
    if let Some(a) = &s.acceptance {
        let kind = if a.self_delivery { "accepted here (self-delivery)" } else { "accepted here" };
        let _ = writeln!(o, "\n{kind}: {}  [{}]", fmt_secs(UnixSecs(a.accepted_at)), at(&a.event));
        if !a.self_delivery {
            let _ = writeln!(o, "  deadline            {}", fmt_secs(UnixSecs(a.deadline)));
        }
        let _ = writeln!(o, "  send params digest  {}", a.send_params_digest);
        let _ = writeln!(o, "  result kept until   {}", fmt_secs(UnixSecs(a.retention_until)));
    }
    if let Some(d) = &s.delivery {
        let _ = writeln!(o, "\ndelivery to {}  [{}]", d.to, d.stream);
        let _ = writeln!(o, "  accepted              {}", fmt_secs(d.accepted_at));
        let _ = writeln!(o, "  deadline              {}", fmt_secs(d.deadline));
        let _ = writeln!(o, "  deliver params digest {}", d.deliver_params_digest);
        let _ = writeln!(o, "  first attempt due     {}", fmt_ms(d.first_due_ms));
        if !d.route_refreshes.is_empty() {
            let _ = writeln!(o, "\nroute refreshes");
            for r in &d.route_refreshes {
                let relays: Vec<String> = r.relays.iter().map(|x| format!("{} ({})", x.id, x.url)).collect();
                let _ = writeln!(
                    o,
                    "  {}  revision {}: {}  [seq {}]",
                    fmt_secs(UnixSecs(r.at)),
                    r.revision,
                    relays.join(", "),
                    r.event.seq
                );
            }
        }
        let _ = writeln!(o, "\nattempts ({})", d.attempts.len());
        for a in &d.attempts {
            // Without a route the attempt went nowhere; its error says why.
            let targets = if a.targets.is_empty() {
                "no route known".to_string()
            } else {
                format!("{} (route revision {})", a.targets.join(" + "), a.route_revision)
            };
            let outcome = match &a.outcome {
                AttemptOutcome::Failed { error, next_due_ms, .. } => {
                    format!("failed: {}: {}; next attempt due {}", error.code, error.message, fmt_ms(*next_due_ms))
                }
                AttemptOutcome::Finished { status, .. } => status_text(status),
                AttemptOutcome::NoOutcome => "no outcome recorded (in flight when the log ends)".into(),
            };
            let _ = writeln!(
                o,
                "  #{} {}  -> {}: {}  [seq {}]",
                a.attempt,
                fmt_secs(UnixSecs(a.started_at)),
                targets,
                outcome,
                a.event.seq
            );
        }
        match &d.finished {
            Some(f) => {
                let by = f.by_attempt.map(|n| format!(" by attempt #{n}")).unwrap_or_default();
                let _ = writeln!(
                    o,
                    "\ndelivery ended {}{by}: {}  [seq {}]",
                    fmt_secs(UnixSecs(f.at)),
                    status_text(&f.status),
                    f.event.seq
                );
            }
            None => {
                let _ = writeln!(o, "\ndelivery not ended when the log ends");
            }
        }
    }
    if !s.status_reports.is_empty() {
        let _ = writeln!(o, "\nstatus reported to the sender's account");
        for r in &s.status_reports {
            let _ = writeln!(o, "  {}  {}  [{}]", fmt_secs(UnixSecs(r.at)), status_text(&r.status), at(&r.event));
        }
    }
    for r in &s.receipts {
        let _ = writeln!(
            o,
            "\nreceived here by account {}: {}  [{}]",
            r.account,
            fmt_secs(UnixSecs(r.accepted_at)),
            at(&r.event)
        );
        let _ = writeln!(o, "  deliver params digest {}", r.digest);
        let _ = writeln!(o, "  result kept until     {}", fmt_secs(UnixSecs(r.retention_until)));
    }
    if let Some(st) = &s.final_status {
        let _ = writeln!(o, "\nfinal status: {} (accepted_at {})", status_text(st), fmt_secs(UnixSecs(st.accepted_at)));
    }
    let _ = writeln!(o, "\ntimeline records created here ({})", s.timeline_records.len());
    for t in &s.timeline_records {
        let _ = writeln!(
            o,
            "  account {} #{} {} (boxes for {}; visible to {}; expires {})  [{}]",
            t.account,
            t.sequence,
            t.direction,
            t.boxes.join(", "),
            t.visible.join(", "),
            fmt_secs(UnixSecs(t.expires_at)),
            at(&t.event)
        );
    }
    if !s.replication.is_empty() {
        let _ = writeln!(o, "\nreplication with the other home relay");
        for r in &s.replication {
            let what = match r.step {
                "received_from_partner" => format!("received from {} (its seq {})", r.partner, r.origin_seq),
                "sent_to_partner" => format!("sent to {} (seq {})", r.partner, r.origin_seq),
                _ => format!("acknowledged by {} (seq {})", r.partner, r.origin_seq),
            };
            let _ =
                writeln!(o, "  account {} {}  {}  [{}]", r.account, fmt_secs(UnixSecs(r.event.at)), what, at(&r.event));
        }
    }
    if !s.problems.is_empty() {
        let _ = writeln!(o, "\nproblems on the way ({}); run `relay audit verify`", s.problems.len());
        for p in &s.problems {
            let _ = writeln!(o, "  {p}");
        }
    }
    o
}
