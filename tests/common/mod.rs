#![allow(dead_code)]
pub mod client;
pub mod cluster;
pub mod relay;
pub mod schema;
