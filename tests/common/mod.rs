#![allow(dead_code)]
pub mod client;
pub mod relay;
pub mod schema;
