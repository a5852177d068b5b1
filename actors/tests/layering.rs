//! The actors depend on narrow handles, never on the service that starts
//! them: `account` and `delivery` name no supervisor, and `delivery` no
//! account, so the three modules form no import cycle. Checked on the
//! sources, so a call back into the supervisor fails here, not in review.

use std::path::Path;

/// Every `.rs` file under `dir`, unit-test folders excluded, with its text.
fn sources(dir: &Path) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("source folder") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "tests") {
                out.extend(sources(&path));
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((path.display().to_string(), std::fs::read_to_string(&path).expect("readable")));
        }
    }
    out
}

/// The lines of `module` (a folder of `src`) that mention any of `names`
/// outside comments.
fn mentions(module: &str, names: &[&str]) -> Vec<String> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(module);
    let files = sources(&dir);
    assert!(!files.is_empty(), "no sources under {}", dir.display());
    let mut hits = Vec::new();
    for (path, text) in files {
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if names.iter().any(|name| code.contains(name)) {
                hits.push(format!("{path}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    hits
}

#[test]
fn accounts_and_deliveries_never_call_back_into_the_supervisor() {
    for module in ["account", "delivery"] {
        let hits = mentions(module, &["supervisor", "Supervisor"]);
        assert!(hits.is_empty(), "{module} reaches the supervisor:\n{}", hits.join("\n"));
    }
}

#[test]
fn deliveries_do_not_depend_on_accounts() {
    let hits = mentions("delivery", &["crate::account", "AccountCmd", "AccountActor"]);
    assert!(hits.is_empty(), "delivery reaches the accounts:\n{}", hits.join("\n"));
}

#[test]
fn the_check_finds_a_mention_where_there_is_one() {
    // The store module names its own type: the scan can find a mention.
    assert!(!mentions("store", &["Store"]).is_empty());
}
