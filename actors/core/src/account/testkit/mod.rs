//! Fixtures for the account rules' tests: accounts, devices, messages
//! and the given/when/then helpers.

pub mod limits;
