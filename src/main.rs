//! `relay`: run a relay, manage its key.

use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "relay", version, about = "Relay for end-to-end encrypted messages between accounts")]
struct Cli {
    /// Log lines as text or as JSON objects (one per line, for collectors).
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
    Audit(relay::audit::cli::AuditArgs),
    /// Load generator: drive real relays (its own, or --relays) over HTTP.
    Bench(relay::bench::BenchArgs),
    /// Manage the relay's key.
    Key {
        #[command(subcommand)]
        command: KeyCommand,
    },
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Write a new relay key (mode 0600) and print its public key.
    Generate {
        #[arg(long)]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,actix_server=warn".into());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).with_current_span(true).init(),
    }
    let result = match cli.command {
        Command::Audit(args) => return ExitCode::from(relay::audit::cli::run(args)),
        Command::Bench(args) => return ExitCode::from(relay::bench::run(args)),
        Command::Key { command: KeyCommand::Generate { out } } => {
            relay::keys::generate(&out).map(|key| println!("{}", relay::keys::public_key(&key)))
        }
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
