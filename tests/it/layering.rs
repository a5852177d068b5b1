//! Modules import one way: no crate of the workspace has an import cycle
//! between its modules (DESIGN *Layers*). The graph is built from the
//! sources, one node per module (a file, or an inline `mod x { … }`), one
//! edge per path that names an item of another module: `use` lines,
//! `crate::…`/`super::…`/`self::…` paths in code and macro arguments, and
//! paths that start with a name a `use` brought in. A path is followed
//! through re-exports (`pub use`, and any `use` a child reaches by
//! `super::`) to the module that defines the item, so a cycle hidden behind
//! a parent's re-export is seen. A `use` of a module itself adds no edge
//! (only the items reached through it do); a glob import is an edge to the
//! module globbed. Declaring a child module (`mod x;`) is not an edge.
//!
//! The scanner is small on purpose (no `syn`: it would not see inside
//! macro calls): it reads tokens with comments and literals removed and
//! knows only `mod`, `use`, item definitions and paths.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// A token of Rust source: an identifier (or keyword), or one punctuation
/// character; `::` is one token. Comments, strings, chars, lifetimes and
/// numbers are dropped. `line` is 1-based.
#[derive(Debug, Clone, PartialEq)]
struct Tok {
    text: String,
    line: usize,
}

fn tokenize(src: &str) -> Vec<Tok> {
    let b = src.as_bytes();
    let (mut i, mut line, mut out) = (0, 1, Vec::new());
    // Skips to just after the string literal that starts at `i` (at its
    // quote, or its `r`/`br` with `#`s), counting lines.
    let skip_raw = |mut i: usize, line: &mut usize| -> usize {
        while b[i] != b'r' {
            i += 1;
        }
        i += 1;
        let mut hashes = 0;
        while b[i] == b'#' {
            hashes += 1;
            i += 1;
        }
        i += 1; // the opening quote
        loop {
            if b[i] == b'\n' {
                *line += 1;
            }
            if b[i] == b'"' && b[i + 1..].iter().take(hashes).filter(|c| **c == b'#').count() == hashes {
                return i + 1 + hashes;
            }
            i += 1;
        }
    };
    while i < b.len() {
        let c = b[i];
        match c {
            b'\n' => {
                line += 1;
                i += 1;
            }
            _ if c.is_ascii_whitespace() => i += 1,
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                // Block comments nest.
                let mut depth = 0;
                loop {
                    if b[i..].starts_with(b"/*") {
                        depth += 1;
                        i += 2;
                    } else if b[i..].starts_with(b"*/") {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        if b[i] == b'\n' {
                            line += 1;
                        }
                        i += 1;
                    }
                }
            }
            b'"' => {
                i += 1;
                while b[i] != b'"' {
                    match b[i] {
                        b'\\' => i += 2,
                        b'\n' => {
                            line += 1;
                            i += 1;
                        }
                        _ => i += 1,
                    }
                }
                i += 1;
            }
            b'r' | b'b' if is_raw_string(&b[i..]) => i = skip_raw(i, &mut line),
            b'b' if b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'\'') => i += 1, // the literal follows
            b'\'' => {
                // A char literal ('a', '\n', '\u{1F600}') or a lifetime ('a).
                if b.get(i + 1) == Some(&b'\\') {
                    i += 2;
                    while b[i] != b'\'' {
                        i += 1;
                    }
                    i += 1;
                } else {
                    let ch = src[i + 1..].chars().next().unwrap_or(' ');
                    let after = i + 1 + ch.len_utf8();
                    if b.get(after) == Some(&b'\'') {
                        i = after + 1;
                    } else {
                        i += 1;
                        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                            i += 1;
                        }
                    }
                }
            }
            _ if c.is_ascii_digit() => {
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.') {
                    // `1..n`: a range, not a number's decimal point.
                    if b[i] == b'.' && b.get(i + 1) == Some(&b'.') {
                        break;
                    }
                    i += 1;
                }
            }
            _ if c.is_ascii_alphabetic() || c == b'_' || c >= 0x80 => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] >= 0x80) {
                    i += 1;
                }
                let mut text = &src[start..i];
                // A raw identifier names the same thing without its `r#`.
                if text == "r" && b.get(i) == Some(&b'#') {
                    let s = i + 1;
                    i = s;
                    while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                        i += 1;
                    }
                    text = &src[s..i];
                }
                out.push(Tok { text: text.to_owned(), line });
            }
            b':' if b.get(i + 1) == Some(&b':') => {
                out.push(Tok { text: "::".into(), line });
                i += 2;
            }
            _ => {
                let ch = src[i..].chars().next().expect("a char");
                out.push(Tok { text: ch.to_string(), line });
                i += ch.len_utf8();
            }
        }
    }
    out
}

/// Whether `b` starts a raw string literal: `r"`, `r#`…`"`, `br"`, `br#`.
fn is_raw_string(b: &[u8]) -> bool {
    let b = b.strip_prefix(b"b").unwrap_or(b);
    let Some(rest) = b.strip_prefix(b"r") else { return false };
    let rest = &rest[rest.iter().take_while(|c| **c == b'#').count()..];
    rest.first() == Some(&b'"')
}

/// A path as written, with where: `crate::a::B` is `["crate", "a", "B"]`.
#[derive(Debug, Clone)]
struct Written {
    segments: Vec<String>,
    file: String,
    line: usize,
}

/// One module of a crate and what its sources say.
#[derive(Debug, Default)]
struct Module {
    /// `crate::a::b`.
    name: String,
    parent: Option<usize>,
    children: BTreeMap<String, usize>,
    /// Names of items defined here (types, functions, traits, consts,
    /// statics, macros).
    items: BTreeSet<String>,
    /// Names a `use` binds here, with the path they stand for.
    bindings: BTreeMap<String, Written>,
    /// Modules glob-imported here (`use x::*`), as written.
    globs: Vec<Written>,
    /// Paths of two or more segments in code (not in `use`).
    paths: Vec<Written>,
}

/// The modules of one crate, read from its root file.
struct Crate {
    modules: Vec<Module>,
}

const ITEM_KEYWORDS: &[&str] = &["struct", "enum", "union", "fn", "trait", "type", "const", "static"];

impl Crate {
    /// Reads the crate whose root file is `root` (`src/lib.rs`), following
    /// `mod x;` to `x.rs` or `x/mod.rs` beside it.
    fn read(root: &Path) -> Crate {
        let mut krate = Crate { modules: vec![Module { name: "crate".into(), ..Module::default() }] };
        let dir = root.parent().expect("a folder").to_path_buf();
        krate.read_file(0, root, dir);
        krate
    }

    /// Reads `file` as the body of module `id`; its child modules' files
    /// are under `dir`.
    fn read_file(&mut self, id: usize, file: &Path, dir: PathBuf) {
        let src = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let toks = tokenize(&src);
        let shown = file.strip_prefix(root()).unwrap_or(file).display().to_string();
        let end = self.read_block(id, &toks, 0, &shown, &dir);
        assert_eq!(end, toks.len(), "{shown}: unbalanced braces");
    }

    /// Reads tokens from `i` as the body of module `id` until the `}` that
    /// closes it (or the end); returns the index after it.
    fn read_block(&mut self, id: usize, t: &[Tok], mut i: usize, file: &str, dir: &Path) -> usize {
        let mut depth = 0usize;
        while i < t.len() {
            let word = t[i].text.as_str();
            match word {
                "{" => depth += 1,
                "}" if depth == 0 => return i + 1,
                "}" => depth -= 1,
                "mod" if t.get(i + 1).is_some_and(|n| is_ident(&n.text)) => {
                    let name = t[i + 1].text.clone();
                    let child = self.add_child(id, &name);
                    let sub = dir.join(&name);
                    match t.get(i + 2).map(|t| t.text.as_str()) {
                        Some(";") => {
                            let (flat, nested) = (dir.join(format!("{name}.rs")), sub.join("mod.rs"));
                            let path = if flat.exists() { flat } else { nested };
                            self.read_file(child, &path, sub);
                            i += 3;
                        }
                        Some("{") => i = self.read_block(child, t, i + 3, file, &sub),
                        _ => i += 1,
                    }
                    continue;
                }
                "use" => {
                    i = self.read_use(id, t, i + 1, file);
                    continue;
                }
                "macro_rules" if t.get(i + 1).is_some_and(|n| n.text == "!") => {
                    if let Some(name) = t.get(i + 2) {
                        self.modules[id].items.insert(name.text.clone());
                    }
                }
                _ if ITEM_KEYWORDS.contains(&word) => {
                    // `const fn f`, `unsafe fn`: the name follows the last keyword.
                    if let Some(name) = t.get(i + 1).filter(|n| is_ident(&n.text) && !is_keyword(&n.text)) {
                        self.modules[id].items.insert(name.text.clone());
                    }
                }
                _ if is_ident(word) && starts_path(t, i) => {
                    let (segments, next) = path_at(t, i);
                    if segments.len() >= 2 {
                        let at = Written { segments, file: file.to_owned(), line: t[i].line };
                        self.modules[id].paths.push(at);
                    }
                    i = next;
                    continue;
                }
                _ => {}
            }
            i += 1;
        }
        i
    }

    fn add_child(&mut self, parent: usize, name: &str) -> usize {
        let id = self.modules.len();
        let full = format!("{}::{name}", self.modules[parent].name);
        self.modules.push(Module { name: full, parent: Some(parent), ..Module::default() });
        self.modules[parent].children.insert(name.to_owned(), id);
        id
    }

    /// Reads a use tree from `i` (after `use`) to its `;`, binding its
    /// names in module `id`; returns the index after the `;`.
    fn read_use(&mut self, id: usize, t: &[Tok], i: usize, file: &str) -> usize {
        let line = t[i].line;
        let end = i + t[i..].iter().position(|t| t.text == ";").expect("a use ends with ;");
        let mut found = Vec::new();
        use_tree(&t[i..end], &mut Vec::new(), &mut found);
        for (segments, bound) in found {
            let written = Written { segments, file: file.to_owned(), line };
            match bound {
                Some(name) => {
                    self.modules[id].bindings.insert(name, written);
                }
                None => self.modules[id].globs.push(written),
            }
        }
        end + 1
    }
}

/// Flattens a use tree (`a::{b, c::d as e, f::*, self}`) into paths, each
/// with the name it binds (`None` for a glob), after `prefix`.
fn use_tree(t: &[Tok], prefix: &mut Vec<String>, out: &mut Vec<(Vec<String>, Option<String>)>) {
    let depth = prefix.len();
    let mut i = 0;
    // A leading `::` names an external crate: the same as without it here.
    if t.first().is_some_and(|t| t.text == "::") {
        i += 1;
    }
    while i < t.len() {
        match t[i].text.as_str() {
            "::" => {}
            "*" => out.push((prefix.clone(), None)),
            "{" => {
                let close = i + matching(&t[i..]);
                for part in split_top(&t[i + 1..close]) {
                    use_tree(part, prefix, out);
                }
                i = close;
            }
            "self" if i == t.len() - 1 || t[i + 1].text == "as" => {
                // `a::{self}` binds `a`; `a::{self as b}` binds `b`.
                let name =
                    if i + 2 < t.len() { t[i + 2].text.clone() } else { prefix.last().cloned().unwrap_or_default() };
                out.push((prefix.clone(), Some(name)));
                break;
            }
            "as" => {
                let name = t[i + 1].text.clone();
                if name != "_" {
                    out.push((prefix.clone(), Some(name)));
                }
                prefix.truncate(depth);
                return;
            }
            word => {
                prefix.push(word.to_owned());
                if i == t.len() - 1 {
                    out.push((prefix.clone(), Some(word.to_owned())));
                }
            }
        }
        i += 1;
    }
    prefix.truncate(depth);
}

/// The length of the bracketed group `t` starts with, up to its closing
/// bracket (the index of that bracket).
fn matching(t: &[Tok]) -> usize {
    let mut depth = 0;
    for (i, tok) in t.iter().enumerate() {
        match tok.text.as_str() {
            "{" => depth += 1,
            "}" => {
                depth -= 1;
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced braces in a use");
}

/// Splits `t` at its top-level commas.
fn split_top(t: &[Tok]) -> Vec<&[Tok]> {
    let (mut parts, mut start, mut depth) = (Vec::new(), 0, 0);
    for (i, tok) in t.iter().enumerate() {
        match tok.text.as_str() {
            "{" => depth += 1,
            "}" => depth -= 1,
            "," if depth == 0 => {
                parts.push(&t[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&t[start..]);
    parts.into_iter().filter(|p| !p.is_empty()).collect()
}

fn is_ident(s: &str) -> bool {
    s.chars().next().is_some_and(|c| c.is_alphabetic() || c == '_')
}

fn is_keyword(s: &str) -> bool {
    matches!(s, "fn" | "unsafe" | "extern" | "async" | "const" | "mut" | "dyn" | "impl" | "for" | "where")
}

/// Whether the identifier at `i` starts a path (is not inside one, after
/// `::`, and is not a field or method after `.`).
fn starts_path(t: &[Tok], i: usize) -> bool {
    i == 0 || !matches!(t[i - 1].text.as_str(), "::" | ".")
}

/// The path that starts at `i` (`a::b::C`, generics skipped:
/// `a::B::<T>::f`), and the index after it.
fn path_at(t: &[Tok], mut i: usize) -> (Vec<String>, usize) {
    let mut segments = vec![t[i].text.clone()];
    i += 1;
    while i + 1 < t.len() && t[i].text == "::" {
        if is_ident(&t[i + 1].text) {
            segments.push(t[i + 1].text.clone());
            i += 2;
        } else {
            // `::<` (turbofish) or `::{` (a group in a macro): the path ends.
            break;
        }
    }
    (segments, i)
}

/// What a path names: a module, or an item of a module, or something of
/// another crate a `use` brought in.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Named {
    Module(usize),
    Item(usize),
    Outside,
}

impl Crate {
    /// What `segments` names when written in module `from`, following
    /// `use` bindings and globs to where the item is defined; `None` for
    /// another crate's path or a local name (a variable, a type parameter).
    fn resolve(&self, from: usize, segments: &[String], seen: &mut Vec<(usize, String)>) -> Option<Named> {
        let (first, rest) = segments.split_first()?;
        let mut at = match first.as_str() {
            "crate" => Named::Module(0),
            "self" => Named::Module(from),
            "super" => Named::Module(self.modules[from].parent?),
            // `Self::f`: an item of the impl's own module.
            "Self" => Named::Item(from),
            name => self.lookup(from, name, rest.is_empty(), seen)?,
        };
        for (n, segment) in rest.iter().enumerate() {
            let m = match at {
                Named::Module(m) => m,
                // An item's associated item or variant: still that item.
                Named::Item(_) => return Some(at),
                Named::Outside => return None,
            };
            at = match segment.as_str() {
                "super" => Named::Module(self.modules[m].parent?),
                "self" => Named::Module(m),
                name => match self.lookup(m, name, n == rest.len() - 1, seen) {
                    Some(found) => found,
                    // A name the scanner cannot place (a derive's output,
                    // an item made by a macro): it belongs to that module.
                    None => Named::Item(m),
                },
            };
        }
        Some(at)
    }

    /// What `name` stands for in module `m`: a child module, an item
    /// defined there, a name a `use` binds there, or one of its globs'.
    /// `last`: the name ends the path (an item is then preferred over a
    /// module of the same name, which lives in another namespace).
    fn lookup(&self, m: usize, name: &str, last: bool, seen: &mut Vec<(usize, String)>) -> Option<Named> {
        // A `use` cycle (`pub use self::*` both ways) would recurse forever.
        if seen.iter().any(|(sm, sn)| *sm == m && sn == name) {
            return None;
        }
        seen.push((m, name.to_owned()));
        let module = &self.modules[m];
        let child = module.children.get(name).map(|c| Named::Module(*c));
        let item = module.items.contains(name).then_some(Named::Item(m));
        let found = if last { item.or(child) } else { child.or(item) };
        let found = found
            .or_else(|| {
                // A name imported from another crate is that crate's, not
                // this module's.
                let w = module.bindings.get(name)?;
                Some(self.resolve(m, &w.segments, seen).unwrap_or(Named::Outside))
            })
            .or_else(|| {
                module.globs.iter().find_map(|g| match self.resolve(m, &g.segments, seen) {
                    Some(Named::Module(target)) => self.lookup(target, name, last, seen),
                    _ => None,
                })
            });
        seen.pop();
        found
    }

    /// The module an edge written as `w` in module `from` points to, if it
    /// names an item of another module (or globs a module).
    fn target(&self, from: usize, w: &Written, glob: bool) -> Option<usize> {
        match self.resolve(from, &w.segments, &mut Vec::new())? {
            Named::Item(m) => Some(m),
            Named::Module(m) if glob => Some(m),
            Named::Module(_) | Named::Outside => None,
        }
    }

    /// Every edge between two different modules, with where it is written
    /// (the first place, for each pair).
    fn edges(&self) -> BTreeMap<(usize, usize), Written> {
        let mut edges = BTreeMap::new();
        for (from, module) in self.modules.iter().enumerate() {
            let uses = module.bindings.values().map(|w| (w, false));
            let all = uses.chain(module.globs.iter().map(|w| (w, true))).chain(module.paths.iter().map(|w| (w, false)));
            for (w, glob) in all {
                if let Some(to) = self.target(from, w, glob).filter(|to| *to != from) {
                    edges.entry((from, to)).or_insert_with(|| w.clone());
                }
            }
        }
        edges
    }

    /// Every import cycle, each as the modules along it with the line that
    /// makes each step: one cycle per strongly connected set of modules.
    fn cycles(&self) -> Vec<String> {
        let edges = self.edges();
        let mut next: HashMap<usize, Vec<usize>> = HashMap::new();
        for (from, to) in edges.keys() {
            next.entry(*from).or_default().push(*to);
        }
        let mut reported = BTreeSet::new();
        let mut out = Vec::new();
        for start in 0..self.modules.len() {
            if reported.contains(&start) {
                continue;
            }
            // The shortest way back to `start`, breadth first.
            let mut came_from: HashMap<usize, usize> = HashMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut back = None;
            while let Some(m) = queue.pop_front() {
                for &n in next.get(&m).into_iter().flatten() {
                    if n == start {
                        back = Some(m);
                        break;
                    }
                    if let std::collections::hash_map::Entry::Vacant(e) = came_from.entry(n) {
                        e.insert(m);
                        queue.push_back(n);
                    }
                }
                if back.is_some() {
                    break;
                }
            }
            let Some(mut m) = back else { continue };
            let mut along = vec![m];
            while m != start {
                m = came_from[&m];
                along.push(m);
            }
            along.reverse();
            along.push(start);
            // Every module that reaches `start` and is reached from it is in
            // this cycle's set: report the set once.
            let tangle = self.strongly_connected(start, &next);
            reported.extend(tangle.iter().copied());
            let steps: Vec<String> = along
                .windows(2)
                .map(|w| {
                    let at = &edges[&(w[0], w[1])];
                    format!(
                        "  {} -> {}   ({}:{}: {})",
                        self.modules[w[0]].name,
                        self.modules[w[1]].name,
                        at.file,
                        at.line,
                        at.segments.join("::")
                    )
                })
                .collect();
            let names: Vec<&str> = tangle.iter().map(|m| self.modules[*m].name.as_str()).collect();
            out.push(format!(
                "{}\n  (one of the cycles among {} modules: {})",
                steps.join("\n"),
                names.len(),
                names.join(", ")
            ));
        }
        out
    }

    /// The modules both reachable from `start` and reaching it.
    fn strongly_connected(&self, start: usize, next: &HashMap<usize, Vec<usize>>) -> BTreeSet<usize> {
        let reach = |from: usize, forward: bool| {
            let mut seen = BTreeSet::from([from]);
            let mut todo = vec![from];
            while let Some(m) = todo.pop() {
                let step: Vec<usize> = if forward {
                    next.get(&m).cloned().unwrap_or_default()
                } else {
                    next.iter().filter(|(_, to)| to.contains(&m)).map(|(f, _)| *f).collect()
                };
                for n in step {
                    if seen.insert(n) {
                        todo.push(n);
                    }
                }
            }
            seen
        };
        reach(start, true).intersection(&reach(start, false)).copied().collect()
    }
}

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The workspace's crates, each by its root source files (library and
/// binary targets).
fn crate_roots() -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let members = manifest.split("members = [").nth(1).and_then(|s| s.split(']').next()).expect("workspace members");
    let mut roots = Vec::new();
    for member in members.split(',').map(|m| m.trim().trim_matches('"')).filter(|m| !m.is_empty()) {
        for file in ["src/lib.rs", "src/main.rs"] {
            let path = root().join(member).join(file);
            if path.exists() {
                roots.push(path);
            }
        }
    }
    roots
}

/// Modules still in an import cycle, by crate root: each entry goes when
/// its crate's cycles are broken, and the test fails when this list and the
/// sources disagree either way, so no cycle is added and none comes back.
const NOT_YET_ONE_WAY: &[(&str, &[&str])] = &[];

/// The modules of `krate` that are in some import cycle.
fn tangled(krate: &Crate) -> BTreeSet<String> {
    let edges = krate.edges();
    let mut next: HashMap<usize, Vec<usize>> = HashMap::new();
    for (from, to) in edges.keys() {
        next.entry(*from).or_default().push(*to);
    }
    let mut out = BTreeSet::new();
    for m in 0..krate.modules.len() {
        if out.contains(&krate.modules[m].name) {
            continue;
        }
        let set = krate.strongly_connected(m, &next);
        // A module alone is no cycle (edges to itself are not kept).
        if set.len() > 1 {
            out.extend(set.into_iter().map(|m| krate.modules[m].name.clone()));
        }
    }
    out
}

#[test]
fn no_crate_has_an_import_cycle_between_its_modules() {
    let roots = crate_roots();
    assert!(roots.len() >= 5, "the workspace's crates: {roots:?}");
    let mut found = Vec::new();
    for path in roots {
        let shown = path.strip_prefix(root()).unwrap_or(&path).display().to_string();
        let krate = Crate::read(&path);
        let known: BTreeSet<String> = NOT_YET_ONE_WAY
            .iter()
            .filter(|(at, _)| *at == shown)
            .flat_map(|(_, modules)| modules.iter().map(|m| m.to_string()))
            .collect();
        let tangled = tangled(&krate);
        if tangled != known {
            let cycles = krate.cycles();
            found.push(format!(
                "{shown}: in cycles now {tangled:?}, listed in NOT_YET_ONE_WAY {known:?}\n{}",
                cycles.join("\n")
            ));
        }
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n\n"));
}

#[test]
fn a_cycle_through_a_re_export_is_found() {
    // fixtures/layering/planted: `a` uses `crate::b::Thing`, which `b`
    // re-exports from `b::inner`; `b::inner` uses `crate::a::f`.
    let krate = Crate::read(&root().join("tests/fixtures/layering/planted/lib.rs"));
    let cycles = krate.cycles();
    assert_eq!(cycles.len(), 1, "{cycles:#?}");
    assert!(cycles[0].contains("crate::a -> crate::b::inner"), "{}", cycles[0]);
    assert!(cycles[0].contains("crate::b::inner -> crate::a"), "{}", cycles[0]);
}

#[test]
fn a_module_used_one_way_is_no_cycle() {
    // fixtures/layering/one_way: the same modules with `b::inner` no
    // longer calling back; paths inside macro calls and strings,
    // comments with `crate::a` are read as they should be, and a name `b`
    // imports from `std` that `b::inner` reaches as `super::Display` is
    // not an edge back to `b`.
    let krate = Crate::read(&root().join("tests/fixtures/layering/one_way/lib.rs"));
    assert_eq!(krate.cycles(), Vec::<String>::new());
    assert!(!krate.edges().is_empty(), "the fixture's edges are seen");
}
