//! Stamps the git revision into `relay --version` (`relay 0.1.0 (abc1234)`).
//! Reruns only when HEAD or the branch it names moves, not on every build.

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_owned())
}

fn main() {
    // A source tree without .git (a tarball, a container build) may say which revision it is.
    println!("cargo:rerun-if-env-changed=RELAY_GIT_REVISION");
    let revision = std::env::var("RELAY_GIT_REVISION").ok().filter(|r| !r.is_empty()).or_else(|| {
        let revision = git(&["rev-parse", "--short=9", "HEAD"])?;
        // HEAD (another branch), HEAD's reflog (a commit, reset or pull in
        // this checkout: it is appended whenever HEAD moves) and the branch's
        // loose ref. Not the refs folder or packed-refs: other branches'
        // commits would rebuild this crate.
        let mut watched = vec![git(&["rev-parse", "--git-path", "HEAD"])?];
        watched.extend(git(&["rev-parse", "--git-path", "logs/HEAD"]));
        if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
            watched.extend(git(&["rev-parse", "--git-path", &branch]));
        }
        // A path that does not exist would make cargo rerun this on every build.
        for path in watched.iter().filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
        Some(revision)
    });
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=RELAY_GIT_REVISION={}", revision.as_deref().unwrap_or("unknown"));
}
