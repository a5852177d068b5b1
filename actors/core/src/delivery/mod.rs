//! A delivery's rules: its events and state, the seed's error table and
//! fixed deadline (`aggregate`), and the retry timetable.

pub mod aggregate;
pub mod due;
#[cfg(test)]
mod model;
pub mod outcome;
pub mod timetable;
