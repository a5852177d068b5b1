//! # relay-schemas
//!
//! The relay protocol's vocabulary, pure and without I/O:
//!
//! - [`RelayError`] and its codes ([`ErrorCode`]), HTTP statuses and the
//!   seed's delivery handling of each code ([`DeliveryHandling`]), and a
//!   peer's error answer as read ([`RemoteErrorBody`]);
//! - [`encoding`]: base64url, RFC 8785 canonical JSON and its digest;
//! - [`ids`]: identifier syntax and the key-bound `account_id`;
//! - [`ijson`]: I-JSON checks (no repeated members, safe integers);
//! - [`sign`]: domain-tagged Ed25519 signatures, verified strictly (and
//!   remembered once verified, in `verified`);
//! - [`objects`]: the core objects of PROTOCOL §2, kept byte-for-byte;
//! - [`methods`]: every method ([`methods::Method`]: wire name, who may call it),
//!   its params and results, and the notifications;
//! - [`checkpoint`]: signed checkpoints of a relay's store (PROTOCOL §10):
//!   leaves, the Merkle root, signing, verification and the *extends* rule;
//! - [`client`]: building and signing objects as a client does;
//! - [`e2e`]: the client encryption profile `relay-e2e/v1` (PROTOCOL §8).
//!
//! JSON Schema files for all of these are in `schemas/json/`, and an
//! OpenAPI 3.1 document for `/v1/rpc/{method}` in `schemas/openapi.json`.

pub mod checkpoint;
pub mod client;
pub mod e2e;
pub mod encoding;
mod error;
pub mod ids;
pub mod ijson;
pub mod methods;
pub mod objects;
pub mod sign;
mod units;
mod verified;

// One path per item: what a module holds is reached through the module
// (`methods::Method`, `objects::Status`); only the error and unit types,
// whose modules are private, through the root.
pub use error::{DeliveryHandling, ErrorCode, RelayError, RemoteError, RemoteErrorBody};
pub use units::{AccountId, MessageId, RelayId, UnixMillis, UnixSecs};
