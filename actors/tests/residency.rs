//! What stays in memory: no account actor outlives a command for an account
//! without events, the resident actors never exceed
//! `Policy::max_resident_accounts` for long, whatever is asked, the least
//! recently used leave first, and an idle
//! actor passivates when the injected clock says it is idle.

use relay_actors::account::{AccountCmd, Reply};
use relay_actors::delivery::NoPeers;
use relay_actors::Supervisor;
use relay_core::clock::ManualClock;
use relay_core::policy::Policy;
use relay_schemas::client::{Account, Device};
use relay_schemas::methods::RegisterParams;
use relay_schemas::objects::Wire;
use std::sync::Arc;
use std::time::{Duration, Instant};

const T0: u64 = 1_800_000_000;

fn supervisor(policy: Policy) -> Supervisor {
    let store = relay_actors::store::Store::temporary().unwrap();
    let sup = Supervisor::new(store, policy, ManualClock::at_ms(T0 * 1000), Arc::new(NoPeers));
    sup.start().unwrap();
    sup
}

fn register(n: u8) -> (String, AccountCmd) {
    let account = Account::from_seed([n; 32]);
    let phone = Device::from_seed("phone", [n.wrapping_add(100); 32]);
    let route = account.route(1, &[("relay-a", "http://a")], T0);
    let v = account.register_params(&route, &account.certificate(&phone, T0, None), "relay-a", false, T0);
    let params: RegisterParams = serde_json::from_str(&v.to_string()).unwrap();
    (account.id.clone(), AccountCmd::AccountRegister { params, digest: format!("r{n}"), known: None })
}

/// Lets the actors (on this test's arbiter) run until `done` holds;
/// fails after 10 s.
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < deadline, "not within 10 s: {what}");
        tokio::task::yield_now().await;
    }
}

#[actix_rt::test]
async fn a_refused_command_for_an_account_without_events_leaves_no_actor() {
    let sup = supervisor(Policy::with_relay_id("relay-a"));
    let (id, cmd) = register(1);
    let AccountCmd::AccountRegister { params, digest, .. } = cmd else { unreachable!() };
    // A newer route is known: the registration is refused in the actor.
    let account = Account::from_seed([1; 32]);
    let newer = Wire::from_value(&account.route(2, &[("relay-b", "http://b")], T0)).unwrap();
    let e = sup.ask(&id, AccountCmd::AccountRegister { params, digest, known: Some(newer) }).await.unwrap_err();
    assert_eq!(e.code, relay_schemas::ErrorCode::RouteStale);
    assert_eq!(sup.resident_accounts(), 0);
    // So are commands for accounts that do not exist at all.
    for n in 10..40u8 {
        let id = Account::from_seed([n; 32]).id;
        sup.ask(&id, AccountCmd::AccountDevicesGet).await.unwrap_err();
    }
    assert_eq!(sup.resident_accounts(), 0);
    // A registered account stays resident.
    let (id, cmd) = register(2);
    sup.ask(&id, cmd).await.unwrap();
    assert_eq!(sup.resident_accounts(), 1);
}

#[actix_rt::test]
async fn resident_account_actors_are_capped_and_evicted_ones_load_again() {
    let mut policy = Policy::with_relay_id("relay-a");
    policy.max_resident_accounts = 8;
    let sup = supervisor(policy);
    let mut ids = vec![];
    for n in 1..=40u8 {
        let (id, cmd) = register(n);
        sup.ask(&id, cmd).await.unwrap();
        ids.push(id);
    }
    eventually("resident actors back under the cap", || sup.resident_accounts() <= 8).await;
    // Evicted accounts lost nothing: each answers from its events.
    for id in &ids {
        match sup.ask(id, AccountCmd::AccountDevicesGet).await.unwrap() {
            Reply::Json(j) => assert!(j.contains("\"phone\""), "{j}"),
            other => panic!("{other:?}"),
        }
    }
    eventually("resident actors back under the cap", || sup.resident_accounts() <= 8).await;
}

/// Past the cap the least recently used leave, not any: four accounts
/// used between every new load stay resident through 24 loads that each
/// push one actor out (with eviction in any other order, one of the four
/// would be out at some check: half the residents are theirs).
#[actix_rt::test]
async fn past_the_cap_the_least_recently_used_actors_leave() {
    let mut policy = Policy::with_relay_id("relay-a");
    policy.max_resident_accounts = 8;
    let sup = supervisor(policy);
    let mut ids = vec![];
    for n in 1..=8u8 {
        let (id, cmd) = register(n);
        sup.ask(&id, cmd).await.unwrap();
        ids.push(id);
    }
    let busy = ids[..4].to_vec();
    for n in 9..=32u8 {
        for id in &busy {
            sup.ask(id, AccountCmd::RouteGet).await.unwrap();
        }
        let (id, cmd) = register(n);
        sup.ask(&id, cmd).await.unwrap();
        eventually("resident actors back at the cap", || sup.resident_accounts() <= 8).await;
        for id in &busy {
            assert!(sup.is_resident(id), "account {n}'s load pushed out a busy account");
        }
        assert!(sup.is_resident(&id), "the account just loaded stays");
    }
}

/// Passivation is decided by the injected clock and fired by the runtime's
/// timers, so with tokio's time paused it needs no wall-clock wait. Alice
/// was idle `passivate_after` by the clock and leaves memory; Bob, active
/// later, stays through the same checks (not vacuous: the checks that took
/// Alice out ran for him too), and leaves once the clock moves on.
#[actix_rt::test]
async fn an_idle_account_actor_passivates_when_the_injected_clock_says_so() {
    tokio::time::pause();
    let mut policy = Policy::with_relay_id("relay-a");
    policy.passivate_after_ms = 1_000; // checked every 500 ms of runtime time
    let clock = ManualClock::at_ms(T0 * 1000);
    let store = relay_actors::store::Store::temporary().unwrap();
    let sup = Supervisor::new(store, policy, clock.clone(), Arc::new(NoPeers));
    sup.start().unwrap();
    let (alice, cmd) = register(1);
    sup.ask(&alice, cmd).await.unwrap();
    clock.advance_ms(600);
    let (bob, cmd) = register(2);
    sup.ask(&bob, cmd).await.unwrap();
    assert_eq!(sup.resident_accounts(), 2);

    // Runtime time alone passes: the checks run, the clock says no one is idle.
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(sup.resident_accounts(), 2, "idle by the runtime's timers, not by the clock");

    // Alice idle 1 s by the clock, Bob 0.4 s: the next check takes Alice only.
    clock.advance_ms(400);
    tokio::time::advance(Duration::from_secs(1)).await;
    eventually("alice passivated", || sup.resident_accounts() == 1).await;
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(sup.resident_accounts(), 1, "bob, active 0.4 s ago by the clock, stays");

    clock.advance_ms(600);
    tokio::time::advance(Duration::from_secs(1)).await;
    eventually("bob passivated", || sup.resident_accounts() == 0).await;
    // Both answer from what they wrote before leaving.
    for id in [&alice, &bob] {
        match sup.ask(id, AccountCmd::AccountDevicesGet).await.unwrap() {
            Reply::Json(j) => assert!(j.contains("\"phone\""), "{j}"),
            other => panic!("{other:?}"),
        }
    }
}
