//! The core crate holds rules only: no runtime, storage or metrics crate
//! may reach it, directly or through a dependency. Checked on the
//! committed `Cargo.lock`, so adding one fails here, not in review.

use std::collections::{BTreeSet, HashMap};

const FORBIDDEN: &[&str] = &["actix", "actix-rt", "sled", "tokio", "dashmap", "prometheus-client"];

/// Package name → the names of its dependencies, from a `Cargo.lock`.
fn dependency_graph(lock: &str) -> HashMap<String, Vec<String>> {
    let mut graph = HashMap::new();
    for package in lock.split("[[package]]").skip(1) {
        let name = package.lines().find_map(|l| l.strip_prefix("name = ")).map(|n| n.trim_matches('"').to_string());
        let deps = package
            .split_once("dependencies = [")
            .map(|(_, rest)| rest.split(']').next().unwrap_or(""))
            .unwrap_or("")
            .split(',')
            // `"name"` or `"name version"`.
            .filter_map(|d| d.trim().trim_matches('"').split(' ').next().filter(|n| !n.is_empty()).map(str::to_string))
            .collect();
        if let Some(name) = name {
            graph.insert(name, deps);
        }
    }
    graph
}

fn reachable(graph: &HashMap<String, Vec<String>>, from: &str) -> BTreeSet<String> {
    let (mut seen, mut todo) = (BTreeSet::new(), vec![from.to_string()]);
    while let Some(p) = todo.pop() {
        if seen.insert(p.clone()) {
            todo.extend(graph.get(&p).into_iter().flatten().cloned());
        }
    }
    seen
}

#[test]
fn the_core_crate_depends_on_no_runtime_storage_or_metrics_crate() {
    let lock = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.lock")).unwrap();
    let graph = dependency_graph(&lock);
    let deps = reachable(&graph, "relay-core");
    assert!(deps.contains("relay-schemas") && deps.contains("serde"), "the lock file parse found {deps:?}");
    let found: Vec<_> = FORBIDDEN.iter().filter(|f| deps.contains(**f)).collect();
    assert!(found.is_empty(), "relay-core reaches {found:?}");
    // The check itself can fail: the actors crate does reach them.
    assert!(reachable(&graph, "relay-actors").contains("sled"));
}
