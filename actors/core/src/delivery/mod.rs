//! A delivery's rules: its events and state, the seed's error table and
//! fixed deadline (`core`), and the retry timetable.

pub mod core;
pub mod due;
#[cfg(test)]
mod model;
pub mod outcome;
pub mod timetable;
