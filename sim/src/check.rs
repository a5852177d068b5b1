//! What the simulator checks, and how far its runs reach.

use std::fmt;

/// The first invariant a run broke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// Simulated milliseconds since the run began.
    pub at_ms: u64,
    pub invariant: &'static str,
    pub detail: String,
    /// The message id involved, if one is: the trace is cut down to it.
    pub mid: Option<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={}ms {}: {}", self.at_ms, self.invariant, self.detail)
    }
}

/// The invariants, by the names a violation carries.
pub mod inv {
    pub const ACKED_LOST: &str = "nothing acknowledged lost";
    pub const DELIVERED_TWICE: &str = "nothing delivered twice";
    pub const STATUS_MONOTONE: &str = "statuses only move forward, terminal ones never change";
    pub const DEADLINE_FIXED: &str = "deadlines fixed at acceptance";
    pub const TARGET_REVISION: &str = "a delivery's target route revision never goes down";
    pub const REVOKED: &str = "a revoked device's later envelopes never accepted";
    pub const CONVERGE: &str = "both homes of an account converge to the same records";
    pub const LIVENESS: &str = "with the network healed, every delivery ends before its deadline";
    pub const LATE_ANSWER: &str = "a late answer changes nothing";
    pub const VISIBILITY: &str = "visibility fixed at acceptance";
    pub const RETENTION: &str = "retention never deletes early";
    pub const PAGE_REFUSED: &str = "a partner home's honest page is never refused";
    pub const CHAIN: &str = "the hash chains verify";
}

/// How often a run reached the states that are hard to reach by luck.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    pub crashes: u64,
    pub crash_with_attempt_in_flight: u64,
    pub power_cut_losing_a_group: u64,
    pub late_reply: u64,
    pub late_reply_after_final_status: u64,
    pub route_change_mid_delivery: u64,
    pub partner_home_apart: u64,
    pub deadline_expiry: u64,
    pub duplicated_requests: u64,
    pub lost_requests: u64,
    pub refused_requests: u64,
    pub clock_jumps: u64,
    pub peer_confirmed: u64,
    pub forwarded_deliveries: u64,
    pub client_retries: u64,
    /// A send found its local receipt already written: a crash lost the
    /// acceptance between the send process's two commits, or the sender's
    /// other home delivered it first.
    pub receipt_before_acceptance: u64,
    /// Messages whose traces the retention sweep removed.
    pub swept: u64,
    /// Page refusals (each pull counts) for a sent message from a device
    /// revoked here by its `created_at` that the partner accepted before it
    /// knew (PROTOCOL §5), until the partner learns it and passes it over.
    pub replication_stalled: u64,
    /// Deliveries ended `state_conflict` while the recipient held the
    /// message under the params of the sender's other home.
    pub other_params_conflict: u64,
    /// Deliveries refused `forbidden` because the sender's route changed in
    /// the second the message was created.
    pub same_second_route_change: u64,
}

impl Coverage {
    pub fn add(&mut self, o: &Coverage) {
        for (a, b) in self.fields_mut().into_iter().zip(o.fields()) {
            *a += b;
        }
    }

    pub fn fields(&self) -> [u64; 20] {
        [
            self.crashes,
            self.crash_with_attempt_in_flight,
            self.power_cut_losing_a_group,
            self.late_reply,
            self.late_reply_after_final_status,
            self.route_change_mid_delivery,
            self.partner_home_apart,
            self.deadline_expiry,
            self.duplicated_requests,
            self.lost_requests,
            self.refused_requests,
            self.clock_jumps,
            self.peer_confirmed,
            self.forwarded_deliveries,
            self.client_retries,
            self.receipt_before_acceptance,
            self.swept,
            self.replication_stalled,
            self.other_params_conflict,
            self.same_second_route_change,
        ]
    }

    fn fields_mut(&mut self) -> [&mut u64; 20] {
        [
            &mut self.crashes,
            &mut self.crash_with_attempt_in_flight,
            &mut self.power_cut_losing_a_group,
            &mut self.late_reply,
            &mut self.late_reply_after_final_status,
            &mut self.route_change_mid_delivery,
            &mut self.partner_home_apart,
            &mut self.deadline_expiry,
            &mut self.duplicated_requests,
            &mut self.lost_requests,
            &mut self.refused_requests,
            &mut self.clock_jumps,
            &mut self.peer_confirmed,
            &mut self.forwarded_deliveries,
            &mut self.client_retries,
            &mut self.receipt_before_acceptance,
            &mut self.swept,
            &mut self.replication_stalled,
            &mut self.other_params_conflict,
            &mut self.same_second_route_change,
        ]
    }

    pub const NAMES: [&'static str; 20] = [
        "crashes",
        "crash with an attempt in flight",
        "power cut losing a group",
        "late reply",
        "late reply after a final status",
        "route change mid-delivery",
        "partner home apart",
        "deadline expiry",
        "duplicated requests",
        "lost requests",
        "refused requests",
        "clock jumps",
        "ended by the other home's status",
        "forwarded deliveries (other home)",
        "client retries",
        "receipt before its acceptance",
        "swept at the end of retention",
        "page refusals: revocation race",
        "state_conflict: other home's params",
        "forbidden: route change that second",
    ];
}

impl fmt::Display for Coverage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, n) in Coverage::NAMES.iter().zip(self.fields()) {
            writeln!(f, "  {name:<36} {n}")?;
        }
        Ok(())
    }
}
