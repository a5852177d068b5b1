//! The `relay audit` command line: parses arguments, calls the audit
//! functions and prints. Exit codes: 0 clean, 1 findings or unreadable data,
//! 2 cannot audit (relay running, no store, bad arguments).

use super::terminal::{safe, SafeWriter};
use super::{checkpoint, export, open_store, parse_time, replay, story, verify, AuditError};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use relay::config::Config;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct AuditArgs {
    /// The relay's TOML config: the data dir is found as `relay serve` finds it.
    #[arg(long, global = true, conflicts_with = "data_dir")]
    pub config: Option<PathBuf>,
    /// The relay's data dir (the store is DIR/store).
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: AuditCommand,
}

// Its doc comments are clap's help text, printed as written: `<id>` there
// is a placeholder for the reader, not HTML.
#[allow(rustdoc::invalid_html_tags)]
#[derive(Subcommand, Debug)]
pub enum AuditCommand {
    /// Check every stream's hash chain, sequences, event decoding and
    /// snapshots; one line per finding (stream, seq, what); exit 1 on any.
    Verify {
        /// Only this stream (e.g. account/<id> or delivery/<from>/<message_id>).
        #[arg(long)]
        stream: Option<String>,
        /// Also decode every protocol object inside the events (timeline
        /// records' envelopes and key boxes, deliveries' params) as the
        /// actors read them; slower. By default these are covered by the
        /// hash chain and read past as JSON: no state, ledger or rule reads them.
        #[arg(long)]
        full: bool,
        /// Instead: whether the store extends this signed checkpoint (JSON,
        /// e.g. one from a peer's witness log); names each stream that does not.
        #[arg(long, value_name = "FILE", conflicts_with = "stream")]
        checkpoint: Option<PathBuf>,
    },
    /// Print the relay's latest signed checkpoint (JSON).
    Checkpoint,
    /// Print the peers' checkpoints this relay witnessed (JSON lines).
    Witnesses {
        /// Only this peer's.
        #[arg(long)]
        peer: Option<String>,
        /// Only each peer's latest checkpoint, as it signed it.
        #[arg(long)]
        latest: bool,
    },
    /// Rebuild one stream's state from its events only and print it (JSON).
    Replay {
        /// The stream: account/<id> or delivery/<from>/<message_id>.
        #[arg(long)]
        stream: String,
        /// Stop after this sequence.
        #[arg(long, value_name = "SEQ")]
        until: Option<u64>,
        /// Also print each event (upcast to the current version), one JSON line each.
        #[arg(long)]
        events: bool,
    },
    /// The whole story of one message on this relay: acceptance, every
    /// delivery attempt, statuses reported, receipt and timeline records.
    Message {
        /// The sender's account id (`envelope.from`).
        from: String,
        /// The message id (`envelope.message_id`).
        message_id: String,
        /// The recipient's account id, when this relay only received the
        /// message (skips searching every account).
        #[arg(long)]
        to: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Events as JSON lines (schemas/json/audit/export-line.schema.json).
    Export {
        /// Only this stream (e.g. account/<id> or delivery/<from>/<message_id>).
        #[arg(long)]
        stream: Option<String>,
        /// Only events written at or after T (unix seconds or RFC 3339).
        #[arg(long, value_name = "T")]
        since: Option<String>,
    },
}

/// Runs `relay audit …`; returns the process exit code.
pub fn run(args: AuditArgs) -> u8 {
    match run_inner(args) {
        Ok(code) => code,
        // The reader had enough (`relay audit export | head`): a normal end, not an error.
        Err(AuditError::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("relay audit: {}", safe(&e.to_string()));
            e.exit_code()
        }
    }
}

fn data_dir(args: &AuditArgs) -> Result<PathBuf, AuditError> {
    match (&args.config, &args.data_dir) {
        (Some(path), None) => {
            Config::load(path).map(|c| c.relay.data_dir).map_err(|e| AuditError::Usage(e.to_string()))
        }
        (None, Some(dir)) => Ok(dir.clone()),
        _ => Err(AuditError::Usage("give the relay's --config PATH or its --data-dir DIR".into())),
    }
}

/// The stores to audit: sled in the data dir, or a cluster's JetStream
/// streams read as they are (a running cluster is not fenced by an audit).
/// In a cluster of several shards, only the shard holding `account` when
/// one is named (a stream's or a message's), else every shard in turn.
fn stores(args: &AuditArgs, account: Option<&str>) -> Result<Vec<(relay_actors::store::Store, String)>, AuditError> {
    if let Some(path) = &args.config {
        let cfg = Config::load(path).map_err(|e| AuditError::Usage(e.to_string()))?;
        let shards = relay::cluster::shards(&cfg);
        if !shards.is_empty() {
            let n = shards.len() as u32;
            let only = account.map(|a| relay_core::shard::of(a, n));
            let mut stores = Vec::new();
            for (k, shard) in (0..n).zip(shards) {
                if only.is_some_and(|o| o != k) {
                    continue;
                }
                let label = shard.stream.clone();
                let engine = relay_actors::store::JetStreamEngine::open_read_only(shard)?;
                stores.push((relay_actors::store::Store::with_engine(std::sync::Arc::new(engine))?, label));
            }
            return Ok(stores);
        }
    }
    let dir = data_dir(args)?;
    Ok(vec![(open_store(&dir)?, dir.display().to_string())])
}

/// The account a stream belongs to: `account/<id>`, `delivery/<from>/…`.
fn stream_account(stream: &str) -> Option<&str> {
    let rest = stream.strip_prefix("account/").or_else(|| stream.strip_prefix("delivery/"))?;
    rest.split('/').next()
}

fn run_inner(args: AuditArgs) -> Result<u8, AuditError> {
    // Checkpoints and witnesses: the data dir's files (`checkpoint.rs`).
    let code = {
        let mut out = SafeWriter::new(std::io::stdout().lock());
        let code = match &args.command {
            AuditCommand::Checkpoint => Some(checkpoint::print_latest(&data_dir(&args)?, &mut out)?),
            AuditCommand::Witnesses { peer, latest } => {
                Some(checkpoint::print_witnesses(&data_dir(&args)?, peer.as_deref(), *latest, &mut out)?)
            }
            AuditCommand::Verify { checkpoint: Some(file), .. } => {
                Some(checkpoint::run_verify(&data_dir(&args)?, args.config.as_deref(), file, &mut out)?)
            }
            _ => None,
        };
        out.flush()?;
        code
    };
    if let Some(code) = code {
        return Ok(code);
    }
    let account = match &args.command {
        AuditCommand::Verify { stream, .. } | AuditCommand::Export { stream, .. } => {
            stream.as_deref().and_then(stream_account)
        }
        AuditCommand::Replay { stream, .. } => stream_account(stream),
        AuditCommand::Message { from, .. } => Some(from.as_str()),
        AuditCommand::Checkpoint | AuditCommand::Witnesses { .. } => None,
    }
    .map(str::to_owned);
    let mut code = 0;
    for (store, label) in stores(&args, account.as_deref())? {
        code = code.max(run_on(&store, &label, &args.command)?);
        // Closed as its drop would close it, then left to the process's
        // end: dropping sled's page cache (the whole tree, after a verify)
        // took a core 0.1 s after the work was done.
        let _ = store.close();
        std::mem::forget(store);
    }
    Ok(code)
}

fn run_on(store: &relay_actors::store::Store, label: &str, command: &AuditCommand) -> Result<u8, AuditError> {
    let stdout = std::io::stdout();
    let mut out = SafeWriter::new(std::io::BufWriter::new(stdout.lock()));
    let code = match command {
        AuditCommand::Verify { stream, full, .. } => run_verify(store, label, stream.as_deref(), *full, &mut out)?,
        AuditCommand::Replay { stream, until, events } => {
            let mut print_event = |ev: &relay_actors::store::StoredEvent, data: &serde_json::Value| {
                if *events {
                    let line = serde_json::json!({
                        "seq": ev.seq, "type": ev.event_type, "version": ev.version, "at": ev.at, "event": data,
                    });
                    let _ = writeln!(out, "{line}");
                }
            };
            let r = replay::replay(store, stream, *until, &mut print_event)?;
            writeln!(out, "{}", serde_json::to_string_pretty(&r.to_json()).unwrap_or_default())?;
            0
        }
        AuditCommand::Message { from, message_id, to, json } => {
            let s = story::message_story(store, from, message_id, to.as_deref())?;
            if *json {
                writeln!(out, "{}", serde_json::to_string_pretty(&s).unwrap_or_default())?;
            } else {
                write!(out, "{}", story::render_text(&s))?;
            }
            if s.found() {
                0
            } else {
                1
            }
        }
        AuditCommand::Export { stream, since } => {
            let since = since.as_deref().map(parse_time).transpose()?;
            let done = export::export(store, stream.as_deref(), since, &mut out)?;
            for what in &done.unreadable {
                eprintln!("relay audit export: skipped unreadable record: {}", safe(&what.to_string()));
            }
            u8::from(!done.unreadable.is_empty())
        }
        // Answered in `run_inner`, without a store.
        AuditCommand::Checkpoint | AuditCommand::Witnesses { .. } => 0,
    };
    out.flush()?;
    Ok(code)
}

fn run_verify(
    store: &relay_actors::store::Store,
    label: &str,
    stream: Option<&str>,
    full: bool,
    out: &mut dyn Write,
) -> Result<u8, AuditError> {
    let started = Instant::now();
    let bar = if std::io::stderr().is_terminal() && stream.is_none() {
        let bar = ProgressBar::with_draw_target(Some(verify::count_streams(store)), ProgressDrawTarget::stderr());
        if let Ok(style) = ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} streams, {msg}") {
            bar.set_style(style.progress_chars("=> "));
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut events = 0u64;
    let mut progress = |streams: u64, n: u64| {
        events += n;
        bar.inc(streams);
        {
            let secs = started.elapsed().as_secs_f64().max(1e-9);
            bar.set_message(format!("{events} events ({:.0}/s)", events as f64 / secs));
        }
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let depth = if full { verify::Depth::Full } else { verify::Depth::Fold };
    let report = verify::verify(store, stream, relay_schemas::UnixSecs(now), depth, &mut progress)?;
    bar.finish_and_clear();
    for f in &report.findings {
        writeln!(out, "{f}")?;
    }
    let secs = started.elapsed().as_secs_f64();
    let pruned = match report.pruned {
        0 => String::new(),
        n => format!(", {n} from their pruned marker ({} pruned whole)", report.pruned_whole),
    };
    let summary = format!(
        "{}: {} streams, {} events, {} snapshots verified in {:.2} s ({:.0} events/s){pruned}; {} finding{}",
        label,
        report.streams,
        report.events,
        report.snapshots,
        secs,
        report.events as f64 / secs.max(1e-9),
        report.findings.len(),
        if report.findings.len() == 1 { "" } else { "s" },
    );
    writeln!(out, "{summary}")?;
    Ok(u8::from(!report.is_clean()))
}

#[cfg(test)]
mod tests {
    use super::stream_account;

    #[test]
    fn a_stream_names_the_account_whose_shard_holds_it() {
        assert_eq!(stream_account("account/ab12"), Some("ab12"));
        assert_eq!(stream_account("delivery/ab12/msg-1"), Some("ab12"));
        assert_eq!(stream_account("kv/route"), None);
    }
}
