//! `relay`: run a relay, manage its key.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

/// mimalloc: a send allocates and frees many small buffers across worker
/// threads; glibc malloc spent about a tenth of the relay's CPU on them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

// mimalloc's option API (`mimalloc.h`); the mimalloc crate links the
// library but exposes this only behind a feature that adds a crate.
extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
}
/// `mi_option_purge_delay` in mimalloc v3's `mi_option_e`.
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// By default mimalloc hands memory idle for 10 ms back to the OS. Under
/// load the relay takes it back at once, and each fault of a transparent
/// huge page zeroes 2 MiB: about a sixth of the relay's CPU per send
/// (`relay bench`, relay CPU per send 511–530 µs before, 427–440 µs
/// after). Kept, the memory is reused; RSS stays at the peak the load
/// reached anyway.
fn keep_freed_memory() {
    // SAFETY: a plain C call; mimalloc asks that options be set before
    // other threads allocate, and main has started none yet.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) }
}

/// `relay --version`: the package version and the git revision it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (", env!("RELAY_GIT_REVISION"), ")");

#[derive(Parser)]
#[command(name = "relay", version = VERSION, about = "Relay for end-to-end encrypted messages between accounts")]
struct Cli {
    /// Log lines (on stderr) as text or as JSON objects (one per line, for
    /// collectors). Which lines: RUST_LOG (default `info`), e.g.
    /// RUST_LOG=debug or RUST_LOG=info,relay::access=warn.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Run a relay.
    Serve {
        /// TOML config; keys can be overridden with RELAY__SECTION__KEY.
        #[arg(long)]
        config: PathBuf,
    },
    /// Audit a stopped relay's event logs: verify, replay, message, export.
    Audit(relay_audit::cli::AuditArgs),
    /// Load generator: drive real relays (its own, or --relays) over HTTP.
    Bench(relay_bench::setup::BenchArgs),
    /// Back up a relay's data dir into a new directory: a running relay
    /// copies itself (over its admin socket) while it serves; a stopped
    /// one's store is opened here.
    Backup {
        /// The relay's config, as for `serve`.
        #[arg(long)]
        config: PathBuf,
        /// Where the backup goes: a new (or empty) directory.
        #[arg(long)]
        out: PathBuf,
    },
    /// Restore a backup into a new data dir (and key files), for `serve`.
    Restore {
        /// The backup directory (`relay backup --out`).
        #[arg(long)]
        from: PathBuf,
        /// The config of the relay to restore: its data dir and key files.
        #[arg(long, conflicts_with = "data_dir", required_unless_present = "data_dir")]
        config: Option<PathBuf>,
        /// Or only a data dir (its keys at the default `relay.key` and `vapid.key` in it).
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
    /// Manage the relay's key.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
    /// Replication between an account's two home relays.
    Replication {
        #[command(subcommand)]
        command: ReplicationCommand,
    },
    /// Cluster mode: one relay on several machines.
    Cluster {
        #[command(subcommand)]
        command: ClusterCommand,
    },
    /// Check a configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Load and validate a config (file and RELAY__… overrides, and the key
    /// file if it exists) without starting a relay; prints `ok` or the error.
    Check {
        /// TOML config, as for `serve`.
        #[arg(long)]
        config: PathBuf,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Start three nats-servers (JetStream, R3) and relay nodes of one
    /// relay on loopback, for trying cluster mode; Ctrl-C stops them.
    Up(relay::cluster::up::UpArgs),
}

#[derive(Subcommand)]
enum ReplicationCommand {
    /// On a stopped relay: mark everything unsynced for each two-home
    /// account's other home, which is offered the whole history again when
    /// it next pulls (nothing is delivered again).
    Reset {
        /// The relay's config, as for `serve`.
        #[arg(long)]
        config: PathBuf,
        /// Only this account.
        #[arg(long)]
        account: Option<String>,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Write a new relay key (mode 0600) and print its public key.
    Generate {
        /// Where to write the key (its directory is created; an existing file is never overwritten).
        #[arg(long)]
        out: PathBuf,
    },
    /// Print the public key of an existing key file (for a peer's `[[peers]]` entry).
    Show {
        /// The key file (e.g. the `relay.key_file` of a config).
        #[arg(long)]
        key_file: PathBuf,
    },
}

/// Where `relay restore` writes: a config's data dir and key files, or a
/// bare data dir with the default key files in it.
fn restore_target(config: Option<PathBuf>, data_dir: Option<PathBuf>) -> Result<relay::backup::Target, String> {
    match (config, data_dir) {
        (Some(path), _) => {
            relay::config::Config::load(&path).map_err(|e| e.to_string()).map(|cfg| relay::backup::Target {
                key_file: cfg.relay.key_file.clone(),
                vapid_key_file: cfg.vapid_key_file(),
                data_dir: cfg.relay.data_dir,
            })
        }
        (None, Some(dir)) => Ok(relay::backup::Target {
            key_file: dir.join("relay.key"),
            vapid_key_file: dir.join("vapid.key"),
            data_dir: dir,
        }),
        (None, None) => Err("give the relay's --config PATH or its --data-dir DIR".into()),
    }
}

fn main() -> ExitCode {
    keep_freed_memory();
    let cli = Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,actix_server=warn".into());
    // Colour only for a person at a terminal; files and collectors get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(true).init(),
    }
    let result = match cli.command {
        Command::Audit(args) => return ExitCode::from(relay_audit::cli::run(args)),
        Command::Bench(args) => return ExitCode::from(relay_bench::run(args)),
        Command::Key { command: KeyCommand::Generate { out } } => {
            relay::keys::generate(&out).map(|key| println!("{}", relay::keys::public_key(&key)))
        }
        Command::Key { command: KeyCommand::Show { key_file } } => {
            relay::keys::load(&key_file).map(|key| println!("{}", relay::keys::public_key(&key)))
        }
        Command::Config { command: ConfigCommand::Check { config } } => relay::config::Config::load(&config)
            .map_err(|e| e.to_string())
            .and_then(|cfg| match cfg.relay.key_file.exists() {
                true => relay::keys::load(&cfg.relay.key_file).map(drop),
                false => Ok(()),
            })
            .map(|()| println!("ok")),
        Command::Replication { command: ReplicationCommand::Reset { config, account } } => {
            relay::config::Config::load(&config)
                .map_err(|e| e.to_string())
                .and_then(|cfg| relay::replication::reset(&cfg, account.as_deref()))
                .map(|n| println!("reset {n} account(s)"))
        }
        Command::Cluster { command: ClusterCommand::Up(args) } => relay::cluster::up::run(args),
        Command::Backup { config, out } => relay::config::Config::load(&config)
            .map_err(|e| e.to_string())
            .and_then(|cfg| relay::backup::run(&cfg, &out))
            .map(|m| {
                println!(
                    "backup of {} at log {:016x}+{} in {}",
                    m.relay_id,
                    m.point.segment,
                    m.point.offset,
                    out.display()
                )
            }),
        Command::Restore { from, config, data_dir } => restore_target(config, data_dir)
            .and_then(|to| relay::backup::restore(&from, &to).map(|m| (m, to)))
            .map(|(m, to)| println!("restored the backup of {} into {}", m.relay_id, to.data_dir.display())),
        Command::Serve { config } => match relay::config::Config::load(&config) {
            Ok(cfg) => actix_web::rt::System::new().block_on(relay::serve(cfg)),
            Err(e) => Err(e.to_string()),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("relay: {e}");
            ExitCode::FAILURE
        }
    }
}
