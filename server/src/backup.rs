//! `relay backup` and `relay restore` (docs/operate/backup-and-upgrade.md).
//!
//! A running relay makes its backup itself, asked over its admin socket:
//! `admin.sock` in the data dir, a Unix socket only the relay's user can
//! open (the data dir is 0700, the socket 0600), never a TCP port. The
//! store's copy is one moment between two groups while commits go on
//! (`Store::backup`); a stopped relay's store is opened by the command
//! itself and copied the same way.
//!
//! A backup directory holds:
//! - `store/`: the event store as of its point (opens as a store of its own);
//! - `checkpoints/`, `witness/`: copied before the store, so no checkpoint
//!   in it claims a head the store copy lacks;
//! - `relay.key`, `vapid.key` (0600): the relay's identity; without it
//!   peers would not know the restored relay and its checkpoints would not
//!   verify, so a backup is as secret as the data dir;
//! - `backup.json`, written last: the relay, the data format, the point.
//!   A directory without it is not a finished backup.

use std::io::{BufRead, BufReader, Write as _};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use relay_actors::store::{BackupPoint, Store, StoreError, FORMAT_VERSION};
use relay_schemas::RelayError;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The admin socket's name in the data dir.
pub const ADMIN_SOCKET: &str = "admin.sock";
/// The manifest's name in a backup directory.
pub const MANIFEST: &str = "backup.json";
const STORE: &str = "store";
const RELAY_KEY: &str = "relay.key";
const VAPID_KEY: &str = "vapid.key";
/// Directories of the data dir copied as they are (their files are
/// written aside and renamed, so each file copied is whole).
const KEPT_DIRS: [&str; 2] = ["checkpoints", "witness"];

/// `backup.json`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Manifest {
    pub relay_id: String,
    /// The data-format version of the copy's store (`store/FORMAT`).
    pub format: u32,
    /// The release that made it.
    pub release: String,
    /// Unix seconds when the copy's point was taken.
    pub made_at: u64,
    /// Where the store's copy ends: its log up to `offset` in `segment`.
    pub point: Point,
    /// Key files in the backup.
    pub keys: Vec<String>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Point {
    pub replay_from: u64,
    pub segment: u64,
    pub offset: u64,
}

/// What a backup copies besides the store: where the relay keeps it.
#[derive(Clone, Debug)]
pub struct Sources {
    pub relay_id: String,
    pub data_dir: PathBuf,
    pub key_file: PathBuf,
    pub vapid_key_file: PathBuf,
}

impl Sources {
    pub fn of(cfg: &crate::config::Config) -> Sources {
        Sources {
            relay_id: cfg.relay.id.clone(),
            data_dir: cfg.relay.data_dir.clone(),
            key_file: cfg.relay.key_file.clone(),
            vapid_key_file: cfg.vapid_key_file(),
        }
    }
}

fn io(what: String) -> impl Fn(std::io::Error) -> RelayError {
    move |e| RelayError::internal(format!("{what}: {e}"))
}

/// Writes a backup of `store` and the files of `from` into `out`, which
/// must be absolute and absent or empty (created 0700).
pub fn write(store: &Store, from: &Sources, out: &Path) -> Result<Manifest, RelayError> {
    if !out.is_absolute() {
        return Err(RelayError::invalid_params(format!("backup directory {} is not an absolute path", out.display())));
    }
    match std::fs::read_dir(out).map(|mut entries| entries.next().is_some()) {
        Ok(true) => return Err(RelayError::invalid_params(format!("backup directory {} is not empty", out.display()))),
        Ok(false) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::DirBuilder::new().mode(0o700).create(out).map_err(io(format!("create {}", out.display())))?
        }
        Err(e) => return Err(io(format!("read {}", out.display()))(e)),
    }
    for dir in KEPT_DIRS {
        copy_tree(&from.data_dir.join(dir), &out.join(dir))?;
    }
    let BackupPoint { replay_from, segment, offset, format, .. } =
        store.backup(&out.join(STORE)).map_err(|e| RelayError::internal(format!("back up the store: {e}")))?;
    // A record for the operator, not a rule: the wall clock.
    let made_at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut keys = Vec::new();
    for (file, name) in [(&from.key_file, RELAY_KEY), (&from.vapid_key_file, VAPID_KEY)] {
        if file.exists() {
            copy_file(file, &out.join(name))?;
            keys.push(name.to_owned());
        }
    }
    let manifest = Manifest {
        relay_id: from.relay_id.clone(),
        format,
        release: env!("CARGO_PKG_VERSION").into(),
        made_at,
        point: Point { replay_from, segment, offset },
        keys,
    };
    let text = serde_json::to_vec_pretty(&manifest).map_err(|e| RelayError::internal(e.to_string()))?;
    write_synced(&out.join(MANIFEST), text.as_slice())?;
    sync_dir(out)?;
    Ok(manifest)
}

/// Copies the files of `from` (absent: nothing) into the new directory
/// `to`, synced; a file removed meanwhile (an old checkpoint) is skipped.
fn copy_tree(from: &Path, to: &Path) -> Result<(), RelayError> {
    let entries = match std::fs::read_dir(from) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(format!("read {}", from.display()))(e)),
    };
    std::fs::DirBuilder::new().mode(0o700).create(to).map_err(io(format!("create {}", to.display())))?;
    for entry in entries {
        let entry = entry.map_err(io(format!("read {}", from.display())))?;
        let kind = entry.file_type().map_err(io(format!("read {}", from.display())))?;
        let target = to.join(entry.file_name());
        if kind.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if kind.is_file() {
            match std::fs::File::open(entry.path()) {
                Ok(mut file) => write_synced(&target, &mut file)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io(format!("read {}", entry.path().display()))(e)),
            }
        }
    }
    sync_dir(to)
}

fn copy_file(from: &Path, to: &Path) -> Result<(), RelayError> {
    let mut file = std::fs::File::open(from).map_err(io(format!("read {}", from.display())))?;
    write_synced(to, &mut file)
}

/// A new file (0600) with what `bytes` reads (streamed: a log segment or
/// sled's file may be large), synced; an existing one is an error.
fn write_synced(path: &Path, mut bytes: impl std::io::Read) -> Result<(), RelayError> {
    let fail = io(format!("write {}", path.display()));
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(&fail)?;
    std::io::copy(&mut bytes, &mut f).map_err(&fail)?;
    f.sync_all().map_err(fail)
}

fn sync_dir(dir: &Path) -> Result<(), RelayError> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(format!("sync {}", dir.display())))
}

// ---- the admin socket (a running relay) ----------------------------------------

/// Serves the admin socket in the data dir until the relay stops: one
/// request line, one answer line per connection. `{"backup":{"out":DIR}}`
/// answers `{"result":MANIFEST}` or `{"error":…}`.
pub fn listen(store: Store, from: Sources) -> Result<Option<AdminSocket>, String> {
    let path = from.data_dir.join(ADMIN_SOCKET);
    // Left by a relay that did not stop cleanly: sled's lock, taken before
    // this, says no other relay runs on this data dir.
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(format!("{}: {e}", path.display())),
        _ => {}
    }
    let listener = match tokio::net::UnixListener::bind(&path) {
        Ok(listener) => listener,
        // A data dir path too long for a socket's address (about 100
        // bytes) must not keep the relay from serving.
        Err(e) => {
            tracing::warn!(socket = %path.display(), error = %e,
                "no admin socket: `relay backup` works only on the stopped relay");
            return Ok(None);
        }
    };
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("admin socket {}: {e}", path.display()))?;
    let task = actix_web::rt::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((conn, _)) => {
                    actix_web::rt::spawn(answer(conn, store.clone(), from.clone()));
                }
                Err(e) => tracing::warn!(error = %e, "admin socket: accept"),
            }
        }
    });
    Ok(Some(AdminSocket { path, task }))
}

/// The admin socket's task; its file is removed when the relay stops.
pub struct AdminSocket {
    path: PathBuf,
    task: actix_web::rt::task::JoinHandle<()>,
}

impl Drop for AdminSocket {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
enum Request {
    #[serde(rename = "backup")]
    Backup { out: PathBuf },
}

async fn answer(conn: tokio::net::UnixStream, store: Store, from: Sources) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let (read, mut tx) = conn.into_split();
    let mut line = String::new();
    // One short line is all a request is.
    let mut read = tokio::io::BufReader::new(read).take(64 << 10);
    let reply = match read.read_line(&mut line).await {
        Err(e) => Err(RelayError::invalid_params(format!("request: {e}"))),
        Ok(_) => match serde_json::from_str::<Request>(&line) {
            Err(e) => Err(RelayError::invalid_params(format!("request: {e}"))),
            Ok(Request::Backup { out }) => {
                tracing::info!(out = %out.display(), "backup requested");
                let started = std::time::Instant::now();
                let made = actix_web::rt::task::spawn_blocking(move || write(&store, &from, &out)).await;
                let made = made.unwrap_or_else(|e| Err(RelayError::internal(format!("backup: {e}"))));
                match &made {
                    Ok(m) => tracing::info!(
                        took_ms = started.elapsed().as_millis() as u64,
                        segment = m.point.segment,
                        offset = m.point.offset,
                        "backup written"
                    ),
                    Err(e) => tracing::error!(error = %e.message, "backup failed"),
                }
                made.and_then(|m| serde_json::to_value(m).map_err(|e| RelayError::internal(e.to_string())))
            }
        },
    };
    let body = match reply {
        Ok(manifest) => json!({ "result": manifest }),
        Err(e) => e.to_body(),
    };
    let _ = tx.write_all(format!("{body}\n").as_bytes()).await;
}

/// `relay backup`: asks the relay running on `from`'s data dir for a
/// backup into `out`; with no relay running there, opens its store here.
pub fn run(cfg: &crate::config::Config, out: &Path) -> Result<Manifest, String> {
    let out = std::path::absolute(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let from = Sources::of(cfg);
    let path = from.data_dir.join(ADMIN_SOCKET);
    use std::io::ErrorKind;
    match std::os::unix::net::UnixStream::connect(&path) {
        Ok(conn) => ask(conn, &out),
        // No relay, or none with a socket (its path too long for one).
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::ConnectionRefused | ErrorKind::InvalidInput) => {
            let store = cfg.open_store()?;
            let made = write(&store, &from, &out).map_err(|e| e.message);
            store.close().map_err(|e| format!("close the store: {e}"))?;
            made
        }
        Err(e) => Err(format!("admin socket {}: {e}", path.display())),
    }
}

fn ask(mut conn: std::os::unix::net::UnixStream, out: &Path) -> Result<Manifest, String> {
    let request = json!({ "backup": { "out": out } });
    conn.write_all(format!("{request}\n").as_bytes()).map_err(|e| format!("admin socket: {e}"))?;
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line).map_err(|e| format!("admin socket: {e}"))?;
    let reply: Value = serde_json::from_str(&line).map_err(|e| format!("admin socket answered {line:?}: {e}"))?;
    if let Some(e) = reply.get("error") {
        return Err(e["message"].as_str().unwrap_or("backup failed").to_owned());
    }
    serde_json::from_value(reply["result"].clone()).map_err(|e| format!("admin socket answered {line:?}: {e}"))
}

// ---- restore ------------------------------------------------------------------------

/// Where `relay restore` puts a backup.
pub struct Target {
    pub data_dir: PathBuf,
    pub key_file: PathBuf,
    pub vapid_key_file: PathBuf,
}

/// `relay restore`: the backup in `from` becomes the data dir of
/// `to`, which must be absent or empty, as must its key files. The copy
/// is made beside it, opened once (its log replayed, its format checked),
/// then renamed into place.
pub fn restore(from: &Path, to: &Target) -> Result<Manifest, String> {
    let manifest_path = from.join(MANIFEST);
    let text = std::fs::read(&manifest_path)
        .map_err(|e| format!("{}: {e} (not a finished backup)", manifest_path.display()))?;
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", manifest_path.display()))?;
    if manifest.format > FORMAT_VERSION {
        return Err(StoreError::Format { found: manifest.format.to_string(), supported: FORMAT_VERSION }.to_string());
    }
    let data_dir = std::path::absolute(&to.data_dir).map_err(|e| format!("{}: {e}", to.data_dir.display()))?;
    if std::fs::read_dir(&data_dir).is_ok_and(|mut d| d.next().is_some()) {
        return Err(format!("relay.data_dir {} is not empty: restore only into a new data dir", data_dir.display()));
    }
    let keys = [(RELAY_KEY, &to.key_file), (VAPID_KEY, &to.vapid_key_file)];
    for (_, file) in keys {
        if file.exists() {
            return Err(format!("{} exists: restore does not overwrite a key", file.display()));
        }
    }
    let name = data_dir.file_name().ok_or_else(|| format!("{}: not a directory name", data_dir.display()))?;
    let parent = data_dir.parent().unwrap_or(Path::new("/"));
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(parent)
        .map_err(|e| format!("{}: {e}", parent.display()))?;
    let stage = parent.join(format!(".{}.restoring", name.to_string_lossy()));
    if stage.exists() {
        return Err(format!(
            "{} exists: an earlier restore stopped there; remove it and run this again",
            stage.display()
        ));
    }
    let staged = || -> Result<(), String> {
        std::fs::DirBuilder::new().mode(0o700).create(&stage).map_err(|e| format!("{}: {e}", stage.display()))?;
        for dir in [STORE, KEPT_DIRS[0], KEPT_DIRS[1]] {
            copy_tree(&from.join(dir), &stage.join(dir)).map_err(|e| e.message)?;
        }
        // Replays the log over the walked pairs; refuses a format it does not know.
        let store = Store::open(&stage.join(STORE)).map_err(|e| format!("the backup's store: {e}"))?;
        store.close().map_err(|e| format!("the backup's store: {e}"))?;
        sync_dir(&stage).map_err(|e| e.message)
    };
    staged()?;
    // An empty directory is replaced whole by the rename.
    std::fs::rename(&stage, &data_dir)
        .map_err(|e| format!("move {} to {}: {e}", stage.display(), data_dir.display()))?;
    sync_dir(parent).map_err(|e| e.message)?;
    for (name, file) in keys {
        if manifest.keys.iter().any(|k| k == name) {
            if let Some(dir) = file.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            copy_file(&from.join(name), file).map_err(|e| e.message)?;
        }
    }
    Ok(manifest)
}
