//! The account through its shell: what needs the store, the actor or the
//! supervisor. The rules' own tests are beside each rule in relay-core
//! (`account/method/<wire name>.rs`), on the same fixture, which these
//! tests share (`relay_core::account::testkit`, the `testkit` feature).

pub(crate) use relay_core::account::testkit::*;

mod push;
mod upgrade;
