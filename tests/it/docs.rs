//! The book in `docs/` and the README hold together: every relative link
//! resolves (to a file, and an `#anchor` to a heading of it), every page of
//! the book is in `docs/SUMMARY.md`, every `PROTOCOL §n` cited in the
//! sources is a section of the protocol reference in `docs/protocol/`, and
//! the configuration reference lists exactly the keys the config code
//! knows, with the defaults it has. No network, no relay process.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Files under `dir` (recursively) whose name ends with one of `exts`,
/// leaving out build output, dependencies and git's own files.
fn files(dir: &Path, exts: &[&str]) -> Vec<PathBuf> {
    const SKIP: &[&str] = &["target", "node_modules", ".git", "dist"];
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !SKIP.contains(&name.as_str()) {
                    todo.push(path);
                }
            } else if exts.iter().any(|ext| name.ends_with(&format!(".{ext}"))) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// README.md and every page of the book.
fn markdown() -> Vec<PathBuf> {
    let mut pages = files(&root().join("docs"), &["md"]);
    pages.insert(0, root().join("README.md"));
    pages
}

/// The lines of a markdown text outside fenced code blocks.
fn prose(text: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// `line` without its inline code spans (`` `[[peers]]` `` is no link).
fn without_code(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// A heading's anchor as mdBook and GitHub make it: lowercase, letters,
/// digits, `-` and `_` kept, spaces turned into `-`, the rest dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The headings of a markdown text, as written.
fn headings(text: &str) -> Vec<String> {
    prose(text)
        .filter(|line| line.starts_with('#'))
        .map(|line| line.trim_start_matches('#').trim().to_owned())
        .collect()
}

/// The anchors of a markdown text's headings; a repeated one gets `-1`,
/// `-2`, … as both renderers do.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for heading in headings(text) {
        let base = slug(&heading);
        let n = seen.entry(base.clone()).or_default();
        out.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

/// The targets of the inline links and images `[text](target)` of a
/// markdown text, outside code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let line = without_code(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let target = &rest[at + 2..];
            let end = target.find(')').unwrap_or(target.len());
            out.push(target[..end].trim().to_owned());
            rest = &target[end..];
        }
    }
    out
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

/// What is wrong with the link `target` in `page`, if anything.
fn broken(page: &Path, target: &str) -> Option<String> {
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let file = if path.is_empty() { page.to_path_buf() } else { page.parent().unwrap().join(path) };
    let shown = file.strip_prefix(root()).unwrap_or(&file).display().to_string();
    if !file.exists() {
        return Some(format!("{shown} does not exist"));
    }
    let anchor = anchor?;
    if file.extension().is_some_and(|ext| ext == "md") && !anchors(&read(&file)).contains(anchor) {
        return Some(format!("{shown} has no heading with the anchor #{anchor}"));
    }
    None
}

#[test]
fn every_relative_link_in_the_readme_and_the_book_resolves() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for page in markdown() {
        for target in links(&read(&page)) {
            if is_external(&target) {
                continue;
            }
            checked += 1;
            if let Some(why) = broken(&page, &target) {
                bad.push(format!("{}: ({target}): {why}", page.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
    assert!(checked > 100, "only {checked} links found: is the scanner broken?");
}

#[test]
fn the_books_walkthroughs_are_the_steps_the_readme_test_runs() {
    use crate::readme::sh_block;
    assert_eq!(sh_block("docs/guide/two-relays.md", "# Two relays\n"), sh_block("README.md", "## Two relays\n"));
    assert_eq!(
        sh_block("docs/guide/two-homes.md", "# One account, two home relays\n"),
        sh_block("README.md", "## One account, two home relays\n")
    );
}

#[test]
fn every_page_of_the_book_is_in_its_summary() {
    let docs = root().join("docs");
    let summary = docs.join("SUMMARY.md");
    let listed: BTreeSet<PathBuf> = links(&read(&summary)).iter().map(|target| docs.join(target)).collect();
    let missing: Vec<_> = files(&docs, &["md"])
        .into_iter()
        .filter(|page| *page != summary && !listed.contains(page))
        .map(|page| page.strip_prefix(root()).unwrap().display().to_string())
        .collect();
    assert!(missing.is_empty(), "pages not reachable from docs/SUMMARY.md: {missing:?}");
    let absent: Vec<_> = listed.iter().filter(|page| !page.exists()).collect();
    assert!(absent.is_empty(), "docs/SUMMARY.md lists pages that do not exist: {absent:?}");
}

/// `text` with each line's comment marker (`//!`, `///`, `//`, `#`, ` * `)
/// dropped and the lines joined by spaces, so that a citation wrapped over
/// two comment lines reads as one.
fn joined(text: &str) -> String {
    let text = text.replace("\\u00a7", "§");
    text.lines()
        .map(|line| {
            let line = line.trim_start();
            ["//!", "///", "//", "# ", "* "].iter().find_map(|marker| line.strip_prefix(marker)).unwrap_or(line).trim()
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The digits at the start of `s`, and what follows them.
fn number(s: &str) -> Option<(u32, &str)> {
    let digits = s.len() - s.trim_start_matches(|c: char| c.is_ascii_digit()).len();
    Some((s[..digits].parse().ok()?, &s[digits..]))
}

/// Every `PROTOCOL §n` in `text`, with the subsection `*Name*` right after
/// it if there is one; `PROTOCOL.md §n` and lists (`§2, §3, §5`, `§4/§5`)
/// count too.
fn citations(text: &str) -> Vec<(u32, Option<String>)> {
    let text = joined(text);
    let mut out = Vec::new();
    for (at, _) in text.match_indices("PROTOCOL") {
        let rest = text[at + "PROTOCOL".len()..].trim_start_matches(".md").trim_start();
        let Some(mut rest) = rest.strip_prefix('§') else { continue };
        while let Some((n, after)) = number(rest) {
            let name =
                after.strip_prefix(" *").and_then(|italic| italic.split_once('*')).map(|(name, _)| name.to_owned());
            out.push((n, name));
            let next = [", §", "/§", " and §"].iter().find_map(|sep| after.strip_prefix(sep));
            match next {
                Some(next) => rest = next,
                None => break,
            }
        }
    }
    out
}

/// The protocol reference's sections: number → the headings of its page.
fn protocol_sections() -> BTreeMap<u32, Vec<String>> {
    let mut sections = BTreeMap::new();
    for page in files(&root().join("docs/protocol"), &["md"]) {
        let text = read(&page);
        let title = headings(&text).into_iter().next().unwrap_or_default();
        if let Some((n, _)) = title.strip_prefix('§').and_then(number) {
            let previous = sections.insert(n, headings(&text));
            assert!(previous.is_none(), "§{n} has two pages");
        }
    }
    sections
}

/// A heading or a cited name as compared: no code or emphasis marks, any case.
fn plain(s: &str) -> String {
    s.replace(['`', '*'], "").to_lowercase()
}

#[test]
fn every_protocol_section_cited_in_the_sources_is_in_the_protocol_reference() {
    let sections = protocol_sections();
    assert_eq!(sections.keys().copied().collect::<Vec<_>>(), (1..=10).collect::<Vec<_>>(), "§1–§10, a page each");
    let mut bad = Vec::new();
    let mut cited = 0;
    let sources = files(root(), &["rs", "md", "js", "mjs", "toml", "json", "sh", "py", "html"]);
    for file in sources {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        for (n, name) in citations(&text) {
            cited += 1;
            let shown = file.strip_prefix(root()).unwrap().display();
            match (sections.get(&n), name) {
                (None, _) => bad.push(format!("{shown}: PROTOCOL §{n}: no such section in docs/protocol")),
                (Some(headings), Some(name)) if !headings.iter().any(|h| plain(h) == plain(&name)) => {
                    bad.push(format!("{shown}: PROTOCOL §{n} *{name}*: no such heading in §{n}'s page"))
                }
                _ => {}
            }
        }
    }
    assert!(bad.is_empty(), "unresolved protocol citations:\n{}", bad.join("\n"));
    assert!(cited > 100, "only {cited} citations found: is the scanner broken?");
}

/// The `docs/….md` paths named in `text` (a comment's pointer to a chapter).
fn doc_paths(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("docs/") {
        let preceded = text[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '/' || c == '_');
        let path = &text[at..];
        let len = path.find(|c: char| !(c.is_alphanumeric() || "/._-".contains(c))).unwrap_or(path.len());
        let path = path[..len].trim_end_matches('.');
        if !preceded && path.ends_with(".md") {
            out.push(path);
        }
    }
    out
}

#[test]
fn every_chapter_a_source_file_points_at_exists() {
    let mut bad = Vec::new();
    let mut named = 0;
    for file in files(root(), &["rs", "js", "mjs", "toml", "sh", "py"]) {
        let Ok(text) = std::fs::read_to_string(&file) else { continue };
        for path in doc_paths(&text) {
            named += 1;
            if !root().join(path).exists() {
                bad.push(format!("{}: {path}", file.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(bad.is_empty(), "chapters that do not exist:\n{}", bad.join("\n"));
    assert!(named > 5, "only {named} chapters named: is the scanner broken?");
}

#[test]
fn doc_paths_are_read_from_comments() {
    assert_eq!(
        doc_paths("// see docs/cluster.md. And docs/guide/two-relays.md, not docs/ alone"),
        ["docs/cluster.md", "docs/guide/two-relays.md"]
    );
    assert_eq!(doc_paths("web/docs/x.md and fuzz/README.md"), Vec::<&str>::new());
}

#[test]
fn citations_are_read_across_comment_lines_and_lists() {
    // Spelled through `p` so that this file cites nothing itself.
    let p = "PROTOCOL";
    let text = format!(
        "/// as the seed says ({p} §5 *What a partner\n/// home may replicate*); also {p}.md §2, §3 and §4/§10.\n"
    );
    assert_eq!(
        citations(&text),
        vec![(5, Some("What a partner home may replicate".into())), (2, None), (3, None), (4, None), (10, None)]
    );
    assert_eq!(citations(&format!("{p} \\u00a710: pruned")), vec![(10, None)]);
    assert_eq!(citations(&format!("`{p} §n` means section n")), vec![]);
}

#[test]
fn slugs_follow_the_renderers_rules() {
    assert_eq!(slug("§1. Encodings"), "1-encodings");
    assert_eq!(slug("Encryption profile `relay-e2e/v1`"), "encryption-profile-relay-e2ev1");
    assert_eq!(slug("2026-12-01: cluster mode, what it costs"), "2026-12-01-cluster-mode-what-it-costs");
    assert_eq!(
        anchors("# A\n## A\n```\n# not a heading\n```\n## A\n"),
        ["a", "a-1", "a-2"].into_iter().map(String::from).collect()
    );
}

/// A config that loads: the required `[relay]` keys, plus `extra`.
fn load(dir: &Path, extra: &str) -> Result<relay::config::Config, String> {
    let path = dir.join("relay.toml");
    let base = "[relay]\nid = \"relay-a\"\npublic_url = \"http://127.0.0.1:1\"\nlisten = \"127.0.0.1:1\"\n\
                data_dir = \"data\"\nkey_file = \"data/relay.key\"\n";
    std::fs::write(&path, format!("{base}{extra}\n")).unwrap();
    relay::config::Config::load(&path).map_err(|e| e.to_string())
}

/// `[cluster]` needs the JetStream engine and its two keys without defaults.
const CLUSTER: &str =
    "[store]\nengine = \"jetstream\"\n[cluster]\nnode = \"n1\"\nnats_urls = [\"nats://127.0.0.1:4222\"]\n";

/// The keys the config code takes in the table `header` (`[limits]`,
/// `[[peers]]`, or "" for the top level), from its refusal of an unknown
/// one: serde names every field it expected.
fn fields(dir: &Path, header: &str) -> BTreeSet<String> {
    let extra = match header {
        // A table of that name is an unknown key at the top level.
        "" => "[zz_not_a_key]\nx = 1".to_owned(),
        // The base config ends in `[relay]`.
        "[relay]" => "zz_not_a_key = 1".to_owned(),
        _ => format!("{header}\nzz_not_a_key = 1"),
    };
    let err = load(dir, &extra).expect_err("an unknown key is refused");
    let expected =
        err.split_once("unknown field `zz_not_a_key`, expected ").unwrap_or_else(|| panic!("{header}: {err}")).1;
    // config-rs adds " for key `…`": where, not what.
    let expected = expected.split(" for key ").next().unwrap();
    expected.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// The config code's keys, as `section.key` (`peers[].id` for the array).
fn code_keys(dir: &Path) -> BTreeSet<String> {
    let mut keys = BTreeSet::new();
    for section in fields(dir, "") {
        let (header, prefix) = match section.as_str() {
            "peers" => ("[[peers]]".to_owned(), "peers[]".to_owned()),
            "relay" => ("[relay]".to_owned(), section.clone()),
            _ => (format!("[{section}]"), section.clone()),
        };
        keys.extend(fields(dir, &header).into_iter().map(|key| format!("{prefix}.{key}")));
    }
    keys
}

/// The rows of the configuration reference: key → its default cell.
fn documented() -> BTreeMap<String, String> {
    let text = read(&root().join("docs/configure/reference.md"));
    let mut rows = BTreeMap::new();
    for line in prose(&text) {
        let cells: Vec<&str> = line.split(" | ").map(|c| c.trim_matches(|c| c == '|' || c == ' ')).collect();
        let Some(key) = cells.first().and_then(|c| c.strip_prefix('`')).and_then(|c| c.strip_suffix('`')) else {
            continue;
        };
        if key.contains('.') && cells.len() >= 3 {
            let previous = rows.insert(key.to_owned(), cells[1].to_owned());
            assert!(previous.is_none(), "{key} has two rows");
        }
    }
    rows
}

#[test]
fn the_configuration_reference_lists_every_key_the_code_knows_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let code = code_keys(dir.path());
    assert!(code.contains("limits.clock_tolerance") && code.contains("peers[].public_key"), "{code:?}");
    let docs: BTreeSet<String> = documented().into_keys().collect();
    let undocumented: Vec<_> = code.difference(&docs).collect();
    let unknown: Vec<_> = docs.difference(&code).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "keys without a row in docs/configure/reference.md: {undocumented:?}\n\
         rows for keys the config code does not know: {unknown:?}"
    );
}

/// A documented default as a TOML value: a number, a boolean or an array
/// as written, anything else a string.
fn toml_value(default: &str) -> String {
    let plain = default.parse::<i64>().is_ok() || ["true", "false"].contains(&default) || default.starts_with('[');
    if plain {
        default.to_owned()
    } else {
        format!("{default:?}")
    }
}

#[test]
fn every_literal_default_in_the_configuration_reference_is_the_codes() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for (key, default) in documented() {
        // A default written as code is a literal; prose (`—`, "none", *relay.id*) is not checked.
        let Some(literal) = default.strip_prefix('`').and_then(|d| d.split_once('`')).map(|(d, _)| d) else {
            continue;
        };
        let (section, name) = key.split_once('.').unwrap();
        let value = toml_value(literal);
        let (base, set) = match section {
            "cluster" => (CLUSTER, format!("{CLUSTER}{name} = {value}")),
            _ => ("", format!("[{section}]\n{name} = {value}")),
        };
        let with = load(dir.path(), &set).unwrap_or_else(|e| panic!("{key} = {literal}: {e}"));
        let without = load(dir.path(), base).unwrap();
        assert_eq!(
            format!("{with:?}"),
            format!("{without:?}"),
            "{key}: the documented default {literal} is not the code's"
        );
        checked += 1;
    }
    assert!(checked > 60, "only {checked} defaults checked");
}
