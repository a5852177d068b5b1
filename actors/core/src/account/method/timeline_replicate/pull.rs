//! The pulling side of `timeline.replicate` (PROTOCOL §5): what this relay
//! asks its partner next, when a pull is done, what a refusal means, and
//! when a pull asked for again goes once more. The replicator in the
//! server library (`relay::replication`) drives it: it sends the requests,
//! has the account apply each page ([`super::apply`]), and queues pulls.
//!
//! A pull starts after this relay's cursor in the partner's stream and
//! pages until the partner has nothing more. Each request acknowledges the
//! page before it (`ack` = the `after` it asks from), sent only once this
//! relay stored that page, so an interrupted pull gets the unacknowledged
//! items again. A partner that is down ends the pull; the next round
//! retries (no backoff here: rounds are `replication.interval` apart).

use super::Page;
use relay_schemas::methods::ReplicateParams;
use relay_schemas::objects::{Route, Wire};
use relay_schemas::{ErrorCode, RelayError};

/// Pages one pull takes at most before it lets others run (it goes to the
/// back of the queue when more is waiting).
pub const PAGES_PER_PULL: usize = 64;

/// The partner this relay pulls an account from in every round: the other
/// home of a route that names this relay and exactly one other relay.
pub fn partner<'r>(route: &'r Wire<Route>, own_id: &str) -> Option<&'r str> {
    let partner = route.relays.iter().find(|r| r.id != own_id)?;
    (route.relays.len() == 2 && route.lists_relay(own_id)).then_some(partner.id.as_str())
}

/// Where the route a page's records must not be older than comes from
/// (`ReplicaApply`'s `known`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KnownRoute {
    /// The account is served here: its own route (the account decides).
    RouteBook,
    /// A page would bring the account here: what the peers say now, as
    /// `account.register` asks (PROTOCOL §5), so a relay the account left
    /// cannot bring it back on its old route.
    AskPeers,
}

/// The known-route rule of a page: for an account served here
/// (`exists_here`, it has events), its own route; else a fresh lookup.
pub fn known_route(exists_here: bool) -> KnownRoute {
    if exists_here {
        KnownRoute::RouteBook
    } else {
        KnownRoute::AskPeers
    }
}

/// One pull of an account from its partner.
#[derive(Clone, Debug)]
pub struct Pull {
    account_id: String,
    /// The cursor the next request asks after (and acknowledges).
    after: u64,
    limit: u32,
    notify: bool,
    /// Pages received so far.
    pages: usize,
}

/// What the pull does after a page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Ask for the next page.
    Ask(ReplicateParams),
    /// The partner has nothing more.
    Done,
    /// [`PAGES_PER_PULL`] pages taken and more waiting: pull again later.
    More,
}

/// What a refusal from the partner means; the pull ends either way.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// `route_stale`: the account left the partner or this relay, which is
    /// no failure. The route it carries, when it is this account's, is
    /// the one to keep (`ReplicaMoved`).
    Moved(Option<Wire<Route>>),
    /// Anything else: the pull failed; the next round tries again.
    Failed,
}

impl Pull {
    /// A pull of `account_id` after `cursor` (where this relay's last pull
    /// from the partner stopped), `limit` items a page; `notify` has the
    /// partner pull back, asked in the first request only.
    pub fn start(account_id: &str, cursor: u64, limit: u32, notify: bool) -> (Pull, ReplicateParams) {
        let pull = Pull { account_id: account_id.to_owned(), after: cursor, limit, notify, pages: 0 };
        let first = pull.request();
        (pull, first)
    }

    fn request(&self) -> ReplicateParams {
        ReplicateParams {
            account_id: self.account_id.clone(),
            after: self.after,
            limit: self.limit,
            ack: Some(self.after),
            notify: self.notify && self.pages == 0,
        }
    }

    /// `page` came (and, when it has items, this relay stored them): the
    /// next request acknowledges it, so a last page with items is followed
    /// by one more request, which the partner marks them synced by. An
    /// empty page that says more is coming only skipped events not offered.
    pub fn after_page(&mut self, page: &Page) -> Step {
        self.pages += 1;
        if page.items.is_empty() && !page.has_more {
            return Step::Done;
        }
        self.after = page.next;
        match self.pages < PAGES_PER_PULL {
            true => Step::Ask(self.request()),
            false => Step::More,
        }
    }

    /// What the partner's refusal `error` means for this pull.
    pub fn refused(&self, error: &RelayError) -> Refusal {
        if error.code != ErrorCode::RouteStale {
            return Refusal::Failed;
        }
        let route = error.data.as_ref().and_then(|d| Wire::<Route>::from_value(&d["route"]).ok());
        Refusal::Moved(route.filter(|r| r.account_id == self.account_id))
    }
}

/// A pull queued or running, and what was asked of it meanwhile: at most
/// one pull per account and partner runs at a time, and asking for one
/// that is queued or running has it go once more after it ends.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Queued {
    again: bool,
    /// Some asker wanted the partner to pull back.
    notify: bool,
}

impl Queued {
    /// The pull was asked for again while queued or running.
    pub fn ask_again(&mut self, notify: bool) {
        self.again = true;
        self.notify |= notify;
    }

    /// The pull ended, `more`: with pages left ([`Step::More`]). Whether
    /// it goes again, and with `notify` when an asker meanwhile wanted it.
    pub fn after(self, more: bool) -> Option<bool> {
        (self.again || more).then_some(self.notify)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Item;
    use super::*;
    use crate::account::events::AccountEvent;
    use relay_schemas::client::Account;

    const ACCOUNT: &str = "aaaa";

    #[test]
    fn a_page_is_checked_against_the_accounts_own_route_here_and_else_against_the_peers_fresh_answer() {
        assert_eq!(known_route(true), KnownRoute::RouteBook);
        assert_eq!(known_route(false), KnownRoute::AskPeers);
    }

    fn page(items: u64, next: u64, has_more: bool) -> Page {
        let item = |sequence| Item {
            sequence,
            event: AccountEvent::ReplicaReset { partner: "relay-b".into() },
            status: None,
            deliver: None,
        };
        Page { items: (next + 1 - items..=next).map(item).collect(), next, has_more, route: None }
    }

    fn asked(step: Step) -> ReplicateParams {
        match step {
            Step::Ask(p) => p,
            other => panic!("another request expected: {other:?}"),
        }
    }

    #[test]
    fn a_pull_starts_after_its_cursor_acknowledging_it_and_asks_to_be_pulled_back_only_first() {
        let (mut pull, first) = Pull::start(ACCOUNT, 7, 100, true);
        assert_eq!(
            first,
            ReplicateParams { account_id: ACCOUNT.into(), after: 7, limit: 100, ack: Some(7), notify: true }
        );
        let second = asked(pull.after_page(&page(2, 9, true)));
        assert!(!second.notify, "notify once per pull");
        let (_, quiet) = Pull::start(ACCOUNT, 0, 100, false);
        assert!(!quiet.notify);
    }

    #[test]
    fn each_request_acknowledges_the_page_before_it() {
        let (mut pull, _) = Pull::start(ACCOUNT, 0, 2, false);
        let next = asked(pull.after_page(&page(2, 5, true)));
        assert_eq!((next.after, next.ack), (5, Some(5)));
        let next = asked(pull.after_page(&page(2, 8, true)));
        assert_eq!((next.after, next.ack), (8, Some(8)));
    }

    #[test]
    fn a_last_page_with_items_is_acknowledged_by_one_more_request_and_an_empty_last_page_ends_the_pull() {
        let (mut pull, _) = Pull::start(ACCOUNT, 0, 100, false);
        let ack = asked(pull.after_page(&page(3, 3, false)));
        assert_eq!(ack.ack, Some(3), "the partner learns they are stored");
        assert_eq!(pull.after_page(&page(0, 3, false)), Step::Done);
    }

    #[test]
    fn an_empty_page_with_more_to_come_moves_the_cursor_past_events_not_offered() {
        let (mut pull, _) = Pull::start(ACCOUNT, 0, 100, false);
        let next = asked(pull.after_page(&page(0, 2_000, true)));
        assert_eq!(next.after, 2_000);
    }

    #[test]
    fn a_pull_lets_others_run_after_its_page_budget_with_more_waiting() {
        let (mut pull, _) = Pull::start(ACCOUNT, 0, 1, false);
        for n in 1..PAGES_PER_PULL as u64 {
            asked(pull.after_page(&page(1, n, true)));
        }
        assert_eq!(pull.after_page(&page(1, PAGES_PER_PULL as u64, true)), Step::More);
    }

    #[test]
    fn route_stale_with_this_accounts_route_is_a_move_and_any_other_refusal_a_failure() {
        let alice = Account::from_seed([1; 32]);
        let route: Wire<Route> = Wire::from_value(&alice.route(2, &[("relay-c", "https://c.example")], 1)).unwrap();
        let stale = |route: &Wire<Route>| {
            RelayError::new(ErrorCode::RouteStale, "moved").with_data(serde_json::json!({ "route": route }))
        };
        let (pull, _) = Pull::start(&alice.id, 0, 100, false);
        assert_eq!(pull.refused(&stale(&route)), Refusal::Moved(Some(route.clone())));
        let (other, _) = Pull::start("bbbb", 0, 100, false);
        assert_eq!(other.refused(&stale(&route)), Refusal::Moved(None), "another account's route is not kept");
        assert_eq!(pull.refused(&RelayError::new(ErrorCode::RouteStale, "no data")), Refusal::Moved(None));
        assert_eq!(pull.refused(&RelayError::internal("down")), Refusal::Failed);
    }

    #[test]
    fn an_account_is_pulled_in_rounds_from_its_other_home_when_its_route_names_this_relay_and_one_other() {
        let alice = Account::from_seed([1; 32]);
        let route = |relays: &[&str]| {
            let relays: Vec<(&str, &str)> = relays.iter().map(|id| (*id, "https://x.example")).collect();
            let route: Wire<Route> = Wire::from_value(&alice.route(1, &relays, 1)).unwrap();
            route
        };
        assert_eq!(partner(&route(&["relay-a", "relay-b"]), "relay-a"), Some("relay-b"));
        assert_eq!(partner(&route(&["relay-b", "relay-a"]), "relay-a"), Some("relay-b"));
        assert_eq!(partner(&route(&["relay-a"]), "relay-a"), None, "one home");
        assert_eq!(partner(&route(&["relay-b", "relay-c"]), "relay-a"), None, "not a home here");
    }

    #[test]
    fn a_pull_asked_for_while_it_runs_goes_once_more_notifying_if_any_asker_wanted_it() {
        assert_eq!(Queued::default().after(false), None, "asked once, done");
        assert_eq!(Queued::default().after(true), Some(false), "more waiting: again, without notify");
        let mut q = Queued::default();
        q.ask_again(false);
        q.ask_again(true);
        q.ask_again(false);
        assert_eq!(q.after(false), Some(true));
    }
}
