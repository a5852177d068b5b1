//! Several relays on loopback that peer with each other: fixed ports picked
//! up front (so a relay keeps its address across restarts) and keys written
//! before start (so every config can name every peer's key).

use super::relay::RelayProc;
use relay_schemas::encoding::b64_encode;
use std::net::TcpListener;
use std::path::{Path, PathBuf};

pub struct Member {
    pub id: String,
    pub url: String,
    pub public_key: String,
}

/// A free loopback port (released for the relay to bind right after),
/// below Linux's ephemeral range (32768–60999): a port picked by the OS for
/// any other socket (`127.0.0.1:0` relays, clients) can never take it in
/// the meantime. Tests run as concurrent processes that each plan ports
/// ahead of starting relays, so a port is also claimed across processes
/// (a file created exclusively under the temp dir): two plans never pick
/// the same one while both may still start a relay on it.
pub fn free_port() -> u16 {
    let claims = std::env::temp_dir().join("relay-it-ports");
    let _ = std::fs::create_dir_all(&claims);
    loop {
        let port = 20_000 + rand::random::<u16>() % 12_000;
        if claim(&claims.join(port.to_string())) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// How long a claim holds: longer than any test runs.
const CLAIM_HOLDS: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// Claims `path` for this process: created anew, or taken over once older
/// than [`CLAIM_HOLDS`] (left by an earlier run).
fn claim(path: &Path) -> bool {
    let create = || std::fs::OpenOptions::new().write(true).create_new(true).open(path).is_ok();
    if create() {
        return true;
    }
    let stale = path.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok());
    stale.is_some_and(|age| age > CLAIM_HOLDS) && std::fs::remove_file(path).is_ok() && create()
}

/// Writes relay `id`'s key file (0600) from `seed`; returns its public key.
pub fn write_key(path: &Path, seed: [u8; 32]) -> String {
    use std::io::Write;
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    writeln!(opts.open(path).unwrap(), "{}", b64_encode(&seed)).unwrap();
    let key = ed25519_dalek::SigningKey::from_bytes(&seed);
    b64_encode(key.verifying_key().as_bytes())
}

/// Plans relays `ids` in `dir` (ports and keys); `start` each when wanted.
pub struct Cluster {
    pub dir: PathBuf,
    pub members: Vec<Member>,
}

impl Cluster {
    pub fn plan(dir: &Path, ids: &[&str]) -> Cluster {
        let members = ids
            .iter()
            .enumerate()
            .map(|(i, id)| {
                let key = dir.join(id).join("relay.key");
                let public_key = write_key(&key, [200 + i as u8; 32]);
                Member { id: id.to_string(), url: format!("http://127.0.0.1:{}", free_port()), public_key }
            })
            .collect();
        Cluster { dir: dir.to_path_buf(), members }
    }

    /// The same relays reached over `https://` (each must then be started
    /// with a certificate, `http.tls_cert_file`).
    pub fn https(mut self) -> Cluster {
        for m in &mut self.members {
            m.url = m.url.replacen("http://", "https://", 1);
        }
        self
    }

    pub fn url(&self, id: &str) -> &str {
        &self.members.iter().find(|m| m.id == id).unwrap().url
    }

    /// Starts relay `id` peering with every other member; `extra` TOML is
    /// appended to its config (sections other than [relay] and [[peers]]).
    pub fn start(&self, id: &str, extra: &str) -> RelayProc {
        self.start_logged(id, extra, "warn")
    }

    /// Like [`Cluster::start`], with `RUST_LOG=rust_log`.
    pub fn start_logged(&self, id: &str, extra: &str, rust_log: &str) -> RelayProc {
        self.start_env(id, extra, rust_log, &[])
    }

    /// Like [`Cluster::start_logged`], with more environment variables for
    /// this run (not for a restart).
    pub fn start_env(&self, id: &str, extra: &str, rust_log: &str, env: &[(&str, &str)]) -> RelayProc {
        self.start_with(id, extra, rust_log, env, None)
    }

    /// Like [`Cluster::start`], reaching peer `via.0` at url `via.1` (a
    /// proxy in front of it) instead of at its own url.
    pub fn start_via(&self, id: &str, via: (&str, &str), extra: &str) -> RelayProc {
        self.start_with(id, extra, "warn", &[], Some(via))
    }

    fn start_with(
        &self,
        id: &str,
        extra: &str,
        rust_log: &str,
        env: &[(&str, &str)],
        via: Option<(&str, &str)>,
    ) -> RelayProc {
        let me = self.members.iter().find(|m| m.id == id).unwrap();
        let mut peers = String::new();
        for m in self.members.iter().filter(|m| m.id != id) {
            let url = via.filter(|(peer, _)| *peer == m.id).map_or(m.url.as_str(), |(_, url)| url);
            peers.push_str(&format!(
                "[[peers]]\nid = \"{}\"\nurl = \"{url}\"\npublic_key = \"{}\"\n\n",
                m.id, m.public_key
            ));
        }
        let listen = me.url.split_once("://").unwrap().1;
        let config = super::relay::write_config_at(&self.dir, id, listen, &format!("{peers}\n{extra}"));
        RelayProc::start_config_env(id, config, self.dir.join(id), rust_log, env)
    }
}
