//! A delivery's rules: its events and state, the seed's error table and
//! fixed deadline (`aggregate`), the retry timetable, and how deliveries
//! to one peer are coalesced into batch calls (`batch`), and what the peers'
//! answers to a route lookup mean (`route_lookup`).

pub mod aggregate;
pub mod batch;
pub mod due;
#[cfg(test)]
mod model;
pub mod outcome;
pub mod route_lookup;
pub mod timetable;
