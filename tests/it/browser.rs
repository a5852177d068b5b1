//! The web client in a real browser: `web/test/browser.mjs` drives headless
//! Chromium (Debian's `chromium`, through `puppeteer-core`) against two
//! relays on loopback that it starts from this build's binary, with the
//! Rust CLI chat (`examples/chat.rs`) as a third party; and
//! `web/test/vectors.mjs` checks the JS implementation of `relay-e2e/v1`
//! against the shared vectors in Node.
//!
//! Needs `node`, `web/node_modules` (`npm ci` in `web/`) and Chromium.
//! `.ci/run` installs them; elsewhere a missing one skips with a message,
//! except under `CI=true`, where it fails.

use crate::common::node::{can_run, node};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[test]
fn js_matches_the_shared_vectors() {
    if !can_run("js_matches_the_shared_vectors") {
        return;
    }
    node(&["test/vectors.mjs".as_ref()], Duration::from_secs(60));
}

/// The web client's pure rules in Node (`web/test/unit.mjs`): day
/// separators on a fixed clock, which errors keep a message queued, safety
/// numbers and link codes, and the scrypt-encrypted backup file.
#[test]
fn js_client_rules_on_a_fixed_clock() {
    if !can_run("js_client_rules_on_a_fixed_clock") {
        return;
    }
    node(&["test/unit.mjs".as_ref()], Duration::from_secs(120));
}

#[test]
fn two_browsers_and_a_terminal_chat_across_two_relays() {
    if !can_run("two_browsers_and_a_terminal_chat_across_two_relays") {
        return;
    }
    let chat = crate::common::relay::example("chat");
    against_relays("test/browser.mjs", &["--chat".as_ref(), chat.as_os_str()], "browser", Duration::from_secs(300));
}

/// Runs `script` (in `web/`) with `extra` args against this build's relay
/// binary in a temp dir, writing its screenshots under the target's tmp
/// dir in `shots`, within `limit`.
fn against_relays(script: &str, extra: &[&std::ffi::OsStr], shots: &str, limit: Duration) {
    let relay = PathBuf::from(env!("CARGO_BIN_EXE_relay"));
    let dir = tempfile::tempdir().expect("tempdir");
    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join(shots);
    let mut args: Vec<&std::ffi::OsStr> = vec![script.as_ref(), "--relay".as_ref(), relay.as_os_str()];
    args.extend_from_slice(extra);
    args.extend(["--dir".as_ref(), dir.path().as_os_str(), "--out".as_ref(), shots.as_os_str()]);
    node(&args, limit);
    eprintln!("screenshots in {}", shots.display());
}

/// The web client as a messenger people use (`web/test/messenger.mjs`),
/// four people on two relays: names and contact requests; a message typed
/// while the sender's relay is down is queued, survives a reload and is
/// delivered exactly once when the relay returns; a third person's message
/// shows an unread count, the tab title and a desktop notification while the
/// tab is hidden; a blocked request stays out; safety numbers agree; backup
/// → clear site data → restore gives the account back; the layout holds at
/// 390 px, in dark mode, and axe-core finds no serious or critical violation.
#[test]
fn a_messenger_people_use_nothing_lost_names_requests_backup() {
    if !can_run("a_messenger_people_use_nothing_lost_names_requests_backup") {
        return;
    }
    against_relays("test/messenger.mjs", &[], "browser-messenger", Duration::from_secs(300));
}

/// QR scanning, short codes and device linking through the relay
/// (`web/test/codes.mjs`), on two relays: Alice's Chromium has a fake
/// camera showing a Y4M video of the QR code the other page displays, and
/// she adds Bob by scanning his contact link; Carol types Bob's short code
/// (held by the other relay); a mistyped code is refused; one new browser
/// is linked by scanning its QR code (a history of 119,000 characters, sent
/// in three messages), another, reloaded while it waits, by typing its
/// short code, each continuing by itself (the answer comes through the
/// relay) with the earlier history; axe-core finds no serious or critical
/// violation.
#[test]
fn qr_scanning_short_codes_and_linking_without_paste() {
    if !can_run("qr_scanning_short_codes_and_linking_without_paste") {
        return;
    }
    against_relays("test/codes.mjs", &[], "browser-codes", Duration::from_secs(300));
}

/// Web Push in the web client (`web/test/push.mjs`): the service worker
/// registers, the client subscribes with the relay's VAPID key and hands
/// the relay the subscription; with the page closed a message becomes a
/// push the stand-in push service decrypts; the service worker shows "New
/// message"; reopening decrypts the message; sign-out unsubscribes.
/// `PushManager.subscribe` is stubbed (headless Chromium reaches no push
/// service): see the header of push.mjs for what runs for real.
#[test]
fn the_service_worker_registers_and_hands_the_relay_a_subscription() {
    if !can_run("the_service_worker_registers_and_hands_the_relay_a_subscription") {
        return;
    }
    against_relays("test/push.mjs", &[], "browser-push", Duration::from_secs(180));
}
