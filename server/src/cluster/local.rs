//! The shards' cores this node serves, for its own front to call in
//! process (`router.rs`): a request whose shard this node owns is answered
//! by that core's handlers on the front's thread, not sent over HTTP to the
//! node's own internal address. The handlers are the ones the core's HTTP
//! server runs (`crate::http::rpc_answer`, `crate::http::relay_call_answer`),
//! on the same app state, so the answers, the rate limits and the lease
//! check (`App::under_lease`) are the same.

use std::net::IpAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use actix_web::web;

use crate::app::App;
use crate::http::client_addr::TrustedProxies;
use crate::observe::PeerObserver;

/// One core, as its front calls it.
pub struct InProcess {
    pub(crate) app: web::Data<App>,
    pub(crate) observer: web::Data<PeerObserver>,
    /// The core's `http.trusted_proxies`, to read a client's address as it would.
    pub(crate) proxies: TrustedProxies,
    /// The address the core would see a front's connection come from: this
    /// node's own, its internal address (a connection to it from this
    /// machine comes from it).
    pub(crate) peer: IpAddr,
    /// Calls under way, waited for before the core stops.
    in_flight: AtomicUsize,
}

impl InProcess {
    pub(crate) fn new(
        app: web::Data<App>,
        observer: web::Data<PeerObserver>,
        proxies: TrustedProxies,
        peer: IpAddr,
    ) -> Self {
        InProcess { app, observer, proxies, peer, in_flight: AtomicUsize::new(0) }
    }

    /// Counts a call under way until the guard drops.
    pub(crate) fn enter(self: &Arc<Self>) -> Entered {
        self.in_flight.fetch_add(1, SeqCst);
        Entered(self.clone())
    }
}

/// A call under way on an [`InProcess`] core.
pub(crate) struct Entered(Arc<InProcess>);

impl Entered {
    pub(crate) fn core(&self) -> &InProcess {
        &self.0
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, SeqCst);
    }
}

/// The cores this node serves now, by shard.
#[derive(Clone)]
pub struct LocalCores(Arc<RwLock<Vec<Option<Arc<InProcess>>>>>);

impl LocalCores {
    pub fn new(shards: u32) -> Self {
        LocalCores(Arc::new(RwLock::new(vec![None; shards as usize])))
    }

    /// Shard `k`'s core, while this node serves it.
    pub(crate) fn get(&self, k: u32) -> Option<Arc<InProcess>> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).get(k as usize).cloned().flatten()
    }

    /// Shard `k` is served by `core` until the returned registration is
    /// [`Registered::withdraw`]n (or dropped).
    pub(crate) fn serve(&self, k: u32, core: InProcess) -> Registered {
        let core = Arc::new(core);
        if let Some(slot) = self.0.write().unwrap_or_else(|e| e.into_inner()).get_mut(k as usize) {
            *slot = Some(core.clone());
        }
        Registered { cores: self.clone(), k, core: Some(core) }
    }
}

/// A core the front calls in process, until withdrawn.
pub(crate) struct Registered {
    cores: LocalCores,
    k: u32,
    core: Option<Arc<InProcess>>,
}

impl Registered {
    /// The front stops calling the core; then the calls under way are
    /// waited for, up to `within` (a graceful stop waits as its HTTP
    /// server does for the requests in flight).
    pub(crate) async fn withdraw(mut self, within: Duration) {
        let Some(core) = self.take() else { return };
        let deadline = tokio::time::Instant::now() + within;
        while core.in_flight.load(SeqCst) > 0 && tokio::time::Instant::now() < deadline {
            actix_web::rt::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn take(&mut self) -> Option<Arc<InProcess>> {
        let core = self.core.take()?;
        let mut cores = self.cores.0.write().unwrap_or_else(|e| e.into_inner());
        // Only our own entry: a later core of the same shard stays.
        if let Some(slot) = cores.get_mut(self.k as usize) {
            if slot.as_ref().is_some_and(|c| Arc::ptr_eq(c, &core)) {
                *slot = None;
            }
        }
        Some(core)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.take();
    }
}
