//! Prometheus metrics of the core (prometheus-client). The transport adds
//! its own families to the same registry and serves `GET /metrics`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::Mutex;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabels {
    pub status: String,
    pub error: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DestinationLabels {
    pub destination: String,
}

/// The core's metrics; cheap to share (every family is an `Arc` inside).
pub struct Metrics {
    /// Families named `relay_*`.
    pub registry: Mutex<Registry>,
    /// Families with names of their own (`process_*`), encoded after `registry`.
    pub unprefixed: Mutex<Registry>,
    /// Deliveries that ended, by final status and error code.
    pub deliveries_finished: Family<StatusLabels, Counter>,
    /// Deliveries accepted and not yet finished.
    pub deliveries_in_flight: Gauge,
    /// Attempts by outcome (answered, rejected, unrecognized, unknown, not_attempted).
    pub attempts: Family<OutcomeLabels, Counter>,
    /// Attempts running now, per destination relay.
    pub attempts_in_flight: Family<DestinationLabels, Gauge>,
    pub actors_resident: Gauge,
    pub actors_passivated: Counter,
    /// Commits made durable by one group (group-commit batch size).
    pub flush_batch: Histogram,
    /// From taking a group to publishing it durable.
    pub flush_seconds: Histogram,
    /// Store commits, groups written, real barriers (fsync/fdatasync) and
    /// bytes the store wrote (its log), for `relay bench`'s cost per send.
    pub store_commits: Counter,
    pub store_groups: Counter,
    pub store_barriers: Counter,
    pub store_bytes_written: Counter,
    /// Messages handed to account and delivery actors (a command, a start):
    /// the hops a request costs, for `relay bench`.
    pub actor_messages: Counter,
    /// Open client WebSocket connections.
    pub websocket_connections: Gauge,
    /// Expired sessions dropped by the sweep.
    pub sessions_swept: Counter,
    pub retention_swept: Counter,
    pub retention_pruned: Counter,
    /// The Unix second of the last retention pass that left nothing due
    /// (`retention::pass`): its lag behind the clock is the sweep's.
    pub retention_caught_up: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Metrics {
            registry: Mutex::new(Registry::with_prefix("relay")),
            unprefixed: Mutex::new(Registry::default()),
            deliveries_finished: Family::default(),
            deliveries_in_flight: Gauge::default(),
            attempts: Family::default(),
            attempts_in_flight: Family::default(),
            actors_resident: Gauge::default(),
            actors_passivated: Counter::default(),
            flush_batch: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            flush_seconds: Histogram::new(exponential_buckets(0.000_05, 2.0, 14)),
            store_commits: Counter::default(),
            store_groups: Counter::default(),
            store_barriers: Counter::default(),
            store_bytes_written: Counter::default(),
            actor_messages: Counter::default(),
            websocket_connections: Gauge::default(),
            sessions_swept: Counter::default(),
            retention_swept: Counter::default(),
            retention_pruned: Counter::default(),
            retention_caught_up: Gauge::default(),
        };
        {
            let mut r = m.registry.lock().unwrap_or_else(|e| e.into_inner());
            r.register(
                "deliveries_finished",
                "Deliveries that ended, by status and error",
                m.deliveries_finished.clone(),
            );
            r.register("deliveries_in_flight", "Accepted deliveries not yet finished", m.deliveries_in_flight.clone());
            r.register("delivery_attempts", "Delivery attempts by outcome", m.attempts.clone());
            r.register(
                "delivery_attempts_in_flight",
                "Attempts running now, per destination",
                m.attempts_in_flight.clone(),
            );
            r.register("account_actors_resident", "Account actors in memory", m.actors_resident.clone());
            r.register("account_actors_passivated", "Account actors passivated", m.actors_passivated.clone());
            r.register("store_flush_batch_commits", "Commits made durable by one group", m.flush_batch.clone());
            r.register("store_flush_seconds", "Time to write one group and make it durable", m.flush_seconds.clone());
            r.register("store_commits", "Store commits made durable", m.store_commits.clone());
            r.register("store_groups", "Groups the store's writer wrote", m.store_groups.clone());
            r.register("store_barriers", "Real durability barriers (fsync/fdatasync)", m.store_barriers.clone());
            r.register("store_bytes_written", "Bytes the store wrote to its log", m.store_bytes_written.clone());
            r.register("actor_messages", "Messages handed to account and delivery actors", m.actor_messages.clone());
            r.register("websocket_connections", "Open client WebSocket connections", m.websocket_connections.clone());
            r.register("sessions_swept", "Expired sessions dropped from memory and store", m.sessions_swept.clone());
            r.register(
                "retention_swept",
                "Messages whose traces the retention sweep deleted",
                m.retention_swept.clone(),
            );
            r.register(
                "retention_pruned",
                "Events deleted from stream prefixes past retention",
                m.retention_pruned.clone(),
            );
            r.register(
                "retention_caught_up_seconds",
                "Unix time of the last retention pass that left nothing due",
                m.retention_caught_up.clone(),
            );
        }
        m
    }
}

impl Metrics {
    /// Prometheus text exposition of everything registered.
    pub fn encode(&self) -> String {
        use prometheus_client::encoding::text::{encode_eof, encode_registry};
        let mut out = String::new();
        for r in [&self.registry, &self.unprefixed] {
            let _ = encode_registry(&mut out, &r.lock().unwrap_or_else(|e| e.into_inner()));
        }
        let _ = encode_eof(&mut out);
        out
    }
}
