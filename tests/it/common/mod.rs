pub mod client;
pub mod cluster;
pub mod fake_peer;
pub mod http;
pub mod proxy;
pub mod push_service;
pub mod relay;
pub mod schema;
pub mod torture;
pub mod wait;
pub mod ws;
pub mod ws_frame;

/// Whether `test` may run, given what it lacks (`missing`, if anything): a
/// missing tool skips it with a printed reason, except under `CI=true`
/// (`.ci/run` installs the tools), where it fails.
pub fn tools_present(test: &str, missing: Option<String>) -> bool {
    match missing {
        None => true,
        Some(what) if std::env::var("CI").as_deref() == Ok("true") => panic!("{test}: {what}"),
        Some(what) => {
            eprintln!("SKIPPED {test}: {what}");
            false
        }
    }
}

/// Copies a directory tree (a stopped relay's data dir, say).
pub fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// Runs `f` on a stopped relay's store (in `data_dir`), then closes it.
pub fn with_store<T>(data_dir: &std::path::Path, f: impl FnOnce(&relay_actors::store::Store) -> T) -> T {
    let store = relay_actors::store::Store::open(&data_dir.join("store")).expect("open store");
    let out = f(&store);
    store.close().unwrap();
    out
}
