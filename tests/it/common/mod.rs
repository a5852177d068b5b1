#![allow(dead_code)]
pub mod client;
pub mod cluster;
pub mod fake_peer;
pub mod http;
pub mod proxy;
pub mod push_service;
pub mod relay;
pub mod schema;
pub mod torture;
pub mod ws;
pub mod ws_frame;
