//! The relay's policy values, in the units the cores compute with. The
//! binary builds one from its configuration (`[relay]`, `[limits]`,
//! `[delivery]`, `[sessions]`).

use relay_schemas::RelayId;

/// The configuration keys a `payload_too_large` names in `data.limit`
/// (PROTOCOL §1), for the bounds the cores apply.
pub const MAX_DEVICES_SETTING: &str = "limits.max_devices";
pub const MAX_REVOKED_CONTACTS_SETTING: &str = "limits.max_revoked_contacts";

#[derive(Clone, Debug)]
pub struct Policy {
    /// This relay's `relay_id`; a route must list it for the relay to serve
    /// the account.
    pub relay_id: RelayId,
    /// Seconds a `created_at` or `issued_at` may lie in the future.
    pub clock_tolerance: u64,
    /// Seconds after `created_at` a message may still be accepted.
    pub delivery_age_limit: u64,
    /// Seconds an acceptance result (and its timeline record) is kept.
    pub message_retention: u64,
    pub max_ciphertext_bytes: usize,
    pub max_boxes: usize,
    /// Bytes of canonical JSON one signed object (certificate, revocation,
    /// route, registration, grant, invite) may have (PROTOCOL §1).
    pub max_object_bytes: usize,
    /// Device certificates one account may hold, revoked ones included
    /// (PROTOCOL §1): its device list, and every answer and per-device
    /// budget built from it, stay bounded.
    pub max_devices: usize,
    /// Contact credentials (grants and invites) one account may revoke: the
    /// revoked ids are kept for good and held by every loaded account.
    pub max_revoked_contacts: usize,
    /// Seconds a session token lives.
    pub session_ttl: u64,
    /// Seconds a session challenge may be answered.
    pub challenge_ttl: u64,
    /// Attempt offsets from acceptance, in milliseconds.
    pub retry_timetable_ms: Vec<u64>,
    /// After the timetable, attempts repeat this often (milliseconds).
    pub retry_then_every_ms: u64,
    pub attempt_timeout_ms: u64,
    /// An account actor writes a snapshot after this many events.
    pub snapshot_every: u64,
    /// An account actor idle this long (milliseconds) is passivated.
    pub passivate_after_ms: u64,
    /// Notifications that may wait for one connected device before its
    /// connection is closed as a slow consumer.
    pub notify_queue: usize,
    /// Delivery attempts in flight at once to one destination relay.
    pub max_in_flight_per_destination: usize,
    /// A peer heard from again makes its pending deliveries due now, at
    /// most this often (milliseconds).
    pub wake_min_interval_ms: u64,
    /// Delivery timers held in memory at most; the rest wait in the store's
    /// due index (`delivery::due`).
    pub timers_in_memory: usize,
    /// Account actors resident at most; past this the least recently used
    /// are passivated at once (memory stays bounded whatever is asked).
    pub max_resident_accounts: usize,
    /// Bytes of records one `message.timeline.sync` page may hold (at least
    /// one record is always served); past that the page ends with `has_more`.
    pub max_page_bytes: usize,
    /// Sessions one device may hold; opening one more drops its oldest.
    pub max_sessions_per_device: usize,
    /// Sessions kept in memory at most (the store holds them all).
    pub session_cache_entries: usize,
    /// What every session token this relay issues starts with: in a
    /// cluster of several shards, the shard's name (`shard::token_prefix`),
    /// so any node's front routes a request by its token alone.
    pub token_prefix: String,
}

impl Policy {
    /// The protocol's defaults (PROTOCOL §6, §7).
    pub fn with_relay_id(relay_id: impl Into<RelayId>) -> Self {
        Policy {
            relay_id: relay_id.into(),
            clock_tolerance: 5 * 60,
            delivery_age_limit: 90 * 60,
            message_retention: 30 * 24 * 3600,
            max_ciphertext_bytes: 65536,
            max_boxes: 64,
            max_object_bytes: relay_schemas::objects::MAX_OBJECT_BYTES,
            max_devices: 32,
            max_revoked_contacts: 1024,
            session_ttl: 24 * 3600,
            challenge_ttl: 5 * 60,
            retry_timetable_ms: vec![0, 30_000, 300_000, 1_500_000, 3_600_000],
            retry_then_every_ms: 3_600_000,
            attempt_timeout_ms: 10_000,
            snapshot_every: 1000,
            passivate_after_ms: 10 * 60 * 1000,
            notify_queue: 256,
            max_in_flight_per_destination: 64,
            max_resident_accounts: 100_000,
            wake_min_interval_ms: 10_000,
            timers_in_memory: 262_144,
            max_page_bytes: 4 << 20,
            max_sessions_per_device: 16,
            session_cache_entries: 65_536,
            token_prefix: String::new(),
        }
    }
}
