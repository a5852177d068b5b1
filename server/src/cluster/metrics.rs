//! A cluster node's own metrics (`cluster.metrics_listen`): the shards it
//! serves and what its front forwards.

use std::sync::Arc;

/// This node's own metrics (`cluster.metrics_listen`).
#[derive(Clone)]
pub(super) struct NodeMetrics {
    pub(super) registry: Arc<prometheus_client::registry::Registry>,
    /// Per shard: 1 while this node serves it; the lease epoch it serves
    /// it under (0: standing by).
    pub(super) shards: Arc<Vec<(Gauge, Gauge)>>,
    /// Connections (one shard) or requests and WebSockets (several) the
    /// front is forwarding now.
    pub(super) connections: Gauge,
    /// Front connections or requests that ended in an error (no owner
    /// reachable within FRONT_WAIT, or a broken upstream).
    pub(super) unserved: prometheus_client::metrics::counter::Counter,
    /// Requests the front had this node's own core answer in process.
    pub(super) in_process: prometheus_client::metrics::counter::Counter,
}

pub(super) type Gauge = prometheus_client::metrics::gauge::Gauge;

impl NodeMetrics {
    pub(super) fn new(node: &str, shards: u32) -> NodeMetrics {
        let mut registry = prometheus_client::registry::Registry::with_labels(
            [(std::borrow::Cow::Borrowed("node"), std::borrow::Cow::Owned(node.to_owned()))].into_iter(),
        );
        let per_shard: Vec<(Gauge, Gauge)> = (0..shards).map(|_| Default::default()).collect();
        for (k, (owned, epoch)) in per_shard.iter().enumerate() {
            let shard = registry.sub_registry_with_label(("shard".into(), k.to_string().into()));
            shard.register("relay_cluster_shard_owned", "1 while this node serves the shard", owned.clone());
            shard.register(
                "relay_cluster_shard_epoch",
                "The lease epoch this node serves the shard under",
                epoch.clone(),
            );
        }
        let (connections, unserved) = (Gauge::default(), prometheus_client::metrics::counter::Counter::default());
        registry.register(
            "relay_cluster_front_connections",
            "Connections (one shard) or requests (several) the front forwards now",
            connections.clone(),
        );
        registry.register(
            "relay_cluster_front_unserved",
            "Front connections or requests that ended in an error",
            unserved.clone(),
        );
        let in_process = prometheus_client::metrics::counter::Counter::default();
        registry.register(
            "relay_cluster_front_in_process",
            "Requests the front had this node's own core answer in process, not over HTTP",
            in_process.clone(),
        );
        NodeMetrics { registry: Arc::new(registry), shards: Arc::new(per_shard), connections, unserved, in_process }
    }

    pub(super) fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    pub(super) fn serve(&self, at: &str) -> Result<(), String> {
        let metrics = self.clone();
        let server = actix_web::HttpServer::new(move || {
            let metrics = metrics.clone();
            actix_web::App::new().route(
                "/metrics",
                actix_web::web::get().to(move || {
                    let body = metrics.encode();
                    async move {
                        actix_web::HttpResponse::Ok()
                            .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
                            .body(body)
                    }
                }),
            )
        })
        .workers(1)
        .shutdown_timeout(1)
        // The node handles SIGTERM itself (standing by) or through the relay's server.
        .disable_signals()
        .bind(at)
        .map_err(|e| format!("cluster.metrics_listen {at}: {e}"))?
        .run();
        actix_web::rt::spawn(server);
        Ok(())
    }
}
