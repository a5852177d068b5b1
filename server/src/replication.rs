//! The replicator: keeps each account that has two home relays the same
//! account at both, by pulling its partner's news with `timeline.replicate`
//! (PROTOCOL §5; the rules are in `relay_core::account::method::timeline_replicate`).
//!
//! When pulls happen:
//! - an account here wrote something its partner has not seen: this relay
//!   pulls from the partner with `notify`, which has the partner pull back
//!   (a nudge that is itself a pull, so no method beyond the protocol's);
//! - a partner's `notify` asks this relay to pull that account now (which
//!   is also how a relay learns of an account registered at the other home);
//! - every `replication.interval`, and once at start, each account whose
//!   route names this relay and another is pulled with `notify`: a relay
//!   that was off catches up by itself, and its partner learns whatever it
//!   missed, in both directions.
//!
//! A pull pages until the partner has nothing more, acknowledging each page
//! in the next request only after this relay's account stored it; so an
//! interrupted pull sends the unacknowledged items again. What to ask next,
//! when a pull is done and when it goes again are the core's
//! (`timeline_replicate::pull`); this file sends, applies and queues. A partner that is
//! down costs one failed request per pull and never blocks anything: the
//! next round retries. At most one pull per account and partner runs at a
//! time (a request for one that is running makes it go once more), and the
//! queue is bounded: a pull it cannot take is left to the next round.

use crate::peers::{CallError, PeerClient};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use relay_actors::account::{AccountCmd, ReplicaSink, Reply};
use relay_actors::Supervisor;
use relay_core::account::method::timeline_replicate::pull::{self, KnownRoute, Pull, Queued, Refusal, Step};
use relay_core::account::method::timeline_replicate::Page;
use relay_core::account::{AccountEvent, Outcome};
use relay_schemas::methods::{AccountIdParams, Method};
use relay_schemas::objects::{DeviceCertificate, Route, Wire};
use relay_schemas::{ErrorCode, RelayError};
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, Semaphore};

#[derive(Clone, Debug)]
pub struct Settings {
    pub interval: Duration,
    pub page: u32,
    pub concurrency: usize,
    pub queue: usize,
}

impl Settings {
    /// The `[replication]` settings, each within its bounds.
    pub fn from_config(cfg: &crate::config::Config) -> Self {
        let r = &cfg.replication;
        Settings {
            interval: r.interval.max(Duration::from_millis(100)),
            page: r.page.clamp(1, relay_schemas::methods::REPLICATE_MAX_LIMIT),
            concurrency: r.concurrency.max(1),
            queue: r.queue.max(1),
        }
    }
}

type Key = (String, String);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: &'static str,
}

pub struct Replicator {
    sup: Supervisor,
    /// `relay_replication_items_total{outcome}`: items pulled from partners,
    /// `applied` (new here), `known` (this relay had them already) or
    /// `refused` (their page broke a rule here, PROTOCOL §5).
    items: Family<OutcomeLabels, Counter>,
    peers: PeerClient,
    settings: Settings,
    tx: mpsc::Sender<(Key, bool)>,
    /// Pulls queued or running.
    slots: Mutex<HashMap<Key, Queued>>,
}

impl Replicator {
    /// Starts the worker and the timer on the current arbiter; registers
    /// as the supervisor's replica sink.
    pub fn start(sup: Supervisor, peers: PeerClient, settings: Settings) -> Arc<Self> {
        let (tx, rx) = mpsc::channel(settings.queue.max(1));
        let items = Family::<OutcomeLabels, Counter>::default();
        sup.metrics().registry.lock().unwrap_or_else(|e| e.into_inner()).register(
            "replication_items",
            "Items pulled from accounts' other home relays (timeline.replicate), by whether they were new here",
            items.clone(),
        );
        let me = Arc::new(Replicator { sup, items, peers, settings, tx, slots: Mutex::default() });
        me.sup.set_replica_sink(me.clone());
        actix_web::rt::spawn(me.clone().work(rx));
        actix_web::rt::spawn(me.clone().rounds());
        me
    }

    /// Has this relay pull `account_id` from `partner` soon; `notify`: and
    /// ask the partner to pull back.
    pub fn pull(&self, account_id: &str, partner: &str, notify: bool) {
        // A route book also keeps routes of accounts of sibling shards
        // (looked up for sends): only the account's own shard keeps it.
        if self.peers.in_sibling_shard(account_id) {
            return;
        }
        let key = (account_id.to_owned(), partner.to_owned());
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(queued) = slots.get_mut(&key) {
            queued.ask_again(notify);
            return;
        }
        if self.tx.try_send((key.clone(), notify)).is_ok() {
            slots.insert(key, Queued::default());
        }
    }

    async fn work(self: Arc<Self>, mut rx: mpsc::Receiver<(Key, bool)>) {
        let running = Arc::new(Semaphore::new(self.settings.concurrency.max(1)));
        while let Some((key, notify)) = rx.recv().await {
            let Ok(permit) = running.clone().acquire_owned().await else { return };
            let me = self.clone();
            actix_web::rt::spawn(async move {
                let more = me.pull_once(&key.0, &key.1, notify).await;
                drop(permit);
                let again = {
                    let mut slots = me.slots.lock().unwrap_or_else(|e| e.into_inner());
                    slots.remove(&key).unwrap_or_default().after(more)
                };
                // Asked for again while it ran, or more is waiting: to the
                // back of the queue, so other accounts get their turn.
                if let Some(notify) = again {
                    me.pull(&key.0, &key.1, notify);
                }
            });
        }
    }

    /// Every `interval` (the first at once): a pull with `notify` for every
    /// account whose route names this relay and a partner.
    async fn rounds(self: Arc<Self>) {
        let own = self.sup.policy().relay_id.to_string();
        let mut tick = actix_web::rt::time::interval(self.settings.interval);
        loop {
            tick.tick().await;
            for shared in self.sup.routes().shared_homes(&own) {
                match shared {
                    Ok((account, partner)) => self.pull(&account, &partner, true),
                    Err(e) => {
                        tracing::warn!(error = %e, "replication round: reading the route book");
                        break;
                    }
                }
            }
        }
    }

    /// Pulls `account_id` from `partner` until it has nothing more (or
    /// the core's page budget is spent); whether more is waiting.
    async fn pull_once(&self, account_id: &str, partner: &str, notify: bool) -> bool {
        match self.try_pull(account_id, partner, notify).await {
            Ok(more) => more,
            Err(e) => {
                // (An unreachable peer is already logged, rate-limited, by the peer client.)
                tracing::debug!(account = account_id, partner, error = %e.message, "replication pull stopped");
                false
            }
        }
    }

    /// Drives the core's [`Pull`]: sends its requests, has the account
    /// apply each page, and stops where it says.
    async fn try_pull(&self, account_id: &str, partner: &str, notify: bool) -> Result<bool, RelayError> {
        let cursor = AccountCmd::ReplicaCursor { partner: partner.to_owned() };
        let cursor = match self.sup.ask(account_id, cursor).await? {
            Reply::Replica(Outcome::Cursor(pulled)) => pulled,
            _ => return Err(RelayError::internal("replica cursor: unexpected reply")),
        };
        let (mut pull, mut params) = Pull::start(account_id, cursor, self.settings.page, notify);
        loop {
            let body = serde_json::to_vec(&params).map_err(|e| RelayError::internal(e.to_string()))?;
            let bytes = match self.peers.call(partner, Method::TimelineReplicate, body).await {
                Ok(bytes) => bytes,
                Err(CallError::Answered { error, .. }) => match pull.refused(&error) {
                    Refusal::Moved(route) => {
                        if let Some(route) = route {
                            let cmd = AccountCmd::ReplicaMoved { partner: partner.to_owned(), route };
                            self.sup.ask(account_id, cmd).await?;
                        }
                        return Ok(false);
                    }
                    Refusal::Failed => return Err(error),
                },
                Err(CallError::NotSent(e) | CallError::Unknown(e)) => return Err(e),
            };
            let page: Page = serde_json::from_slice(&bytes).map_err(|e| {
                RelayError::new(
                    relay_schemas::ErrorCode::BadGateway,
                    format!("{partner}: unreadable timeline.replicate page: {e}"),
                )
            })?;
            let items = page.items.len();
            tracing::debug!(
                account = account_id,
                partner,
                after = params.after,
                items,
                next = page.next,
                "replication page"
            );
            let step = pull.after_page(&page);
            if items > 0 {
                let known = self.known_route(account_id).await?;
                let senders = self.senders_of(&page).await;
                let cmd =
                    AccountCmd::ReplicaApply { partner: partner.to_owned(), page: Box::new(page), known, senders };
                let applied = self.sup.ask(account_id, cmd).await.inspect_err(|e| {
                    if e.code != ErrorCode::InternalError {
                        tracing::warn!(account = account_id, partner, error = %e.message, "replicated page refused");
                        self.items.get_or_create(&OutcomeLabels { outcome: "refused" }).inc_by(items as u64);
                    }
                })?;
                if let Reply::Replica(Outcome::Applied { items: applied }) = applied {
                    let known = items.saturating_sub(applied);
                    self.items.get_or_create(&OutcomeLabels { outcome: "applied" }).inc_by(applied as u64);
                    self.items.get_or_create(&OutcomeLabels { outcome: "known" }).inc_by(known as u64);
                }
            }
            params = match step {
                Step::Ask(next) => next,
                Step::Done => return Ok(false),
                Step::More => return Ok(true),
            };
        }
    }
}

impl Replicator {
    /// The highest route of `account_id` the page's must not be older than,
    /// from where the core's [`pull::known_route`] says.
    async fn known_route(&self, account_id: &str) -> Result<Option<Wire<Route>>, RelayError> {
        Ok(match pull::known_route(self.sup.account_exists(account_id)?) {
            KnownRoute::RouteBook => self.sup.routes().get(account_id).ok().flatten(),
            KnownRoute::AskPeers => self.sup.resolve_route(account_id, true).await,
        })
    }

    /// Certificates for the page's received records that carry none (the
    /// partner accepted them before certificates were kept with them): the
    /// senders' device lists, from this relay or the senders' homes, as
    /// `account.devices.get` reads them. A sender not found leaves its
    /// record unverifiable, and the page is refused.
    async fn senders_of(&self, page: &Page) -> Vec<Wire<DeviceCertificate>> {
        let unkept: BTreeSet<&str> = page
            .items
            .iter()
            .filter_map(|i| match &i.event {
                AccountEvent::MessageReceived { from, sender_certificate: None, .. } => Some(from.as_str()),
                _ => None,
            })
            .collect();
        // At most one lookup per item of the page (bounded by its limit),
        // and only for records written before this relay kept certificates.
        let mut certs = Vec::new();
        for from in unkept {
            certs.extend(self.devices_of(from).await.unwrap_or_default());
        }
        certs
    }

    async fn devices_of(&self, account_id: &str) -> Option<Vec<Wire<DeviceCertificate>>> {
        #[derive(serde::Deserialize)]
        struct Devices {
            certificates: Vec<Wire<DeviceCertificate>>,
        }
        let read = |json: &[u8]| serde_json::from_slice::<Devices>(json).ok().map(|d| d.certificates);
        if self.sup.account_exists(account_id).ok()? {
            return match self.sup.ask(account_id, AccountCmd::AccountDevicesGet).await.ok()? {
                Reply::Json(json) => read(json.as_bytes()),
                _ => None,
            };
        }
        let body = serde_json::to_vec(&AccountIdParams { account_id: account_id.to_owned() }).ok()?;
        let route = self.sup.resolve_route(account_id, false).await?;
        for home in &route.relays {
            if let Ok(bytes) = self.peers.call(&home.id, Method::RelayAccountDevicesGet, body.clone()).await {
                return read(&bytes);
            }
        }
        None
    }
}

impl ReplicaSink for Replicator {
    fn changed(&self, account_id: &str, partner: &str) {
        self.pull(account_id, partner, true);
    }
}

/// `relay replication reset`: on a stopped relay, marks everything of each
/// two-home account (or `only` that one) unsynced for its partner, so the
/// partner is offered the whole history again at its next pull. Finished
/// deliveries stay finished and nothing is delivered again: the partner
/// keeps one record per message (its ledger) and starts no delivery for a
/// message it knows. The number of accounts reset.
pub fn reset(cfg: &crate::config::Config, only: Option<&str>) -> Result<usize, String> {
    let store = cfg.open_store()?;
    let clock: relay_core::clock::SharedClock = Arc::new(relay_core::clock::SystemClock);
    let transport = Arc::new(relay_actors::delivery::NoPeers);
    let sup = Supervisor::new(store.clone(), cfg.policy(), clock, transport);
    let pairs = sup
        .routes()
        .shared_homes(&cfg.relay.id)
        .filter(|p| only.is_none_or(|a| p.as_ref().map_or(true, |(account, _)| account == a)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("reading the route book: {e}"))?;
    let n = pairs.len();
    actix_web::rt::System::new().block_on(async {
        for (account, partner) in pairs {
            let cmd = AccountCmd::ReplicaReset { partner };
            sup.ask(&account, cmd).await.map_err(|e| format!("account {account}: {}", e.message))?;
        }
        Ok::<_, String>(())
    })?;
    store.flush().map_err(|e| format!("flush: {e}"))?;
    Ok(n)
}
