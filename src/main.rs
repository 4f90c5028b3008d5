//! `combd`: start-up, the signal that drains the node, and exit codes.
//!
//! Exit codes: 0 after a clean drain; 78 (EX_CONFIG) for an invalid setting, after one line
//! naming it; 70 (EX_SOFTWARE) when a shard fails.

use std::io::Write as _;

use combd_kernel::limits;
use combd_kernel::memory::MemoryProbe;
use combd_kernel::settings::{help_text, Command, Settings};
use combd_kernel::sys;
use combd_shards::{Node, NodeConfig};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use tracing::{error, info, warn};

use combd::apps;

/// Counts what a call of a cell allocates, for apps with a `memory_kb` limit.
#[global_allocator]
static ALLOC: combd_shards::alloc::CountingAlloc = combd_shards::alloc::CountingAlloc;
mod coordinator;
mod notify;
mod top;

const EX_CONFIG: i32 = 78;
const EX_SOFTWARE: i32 = 70;

fn config_fail(message: impl std::fmt::Display) -> ! {
    eprintln!("combd: {message}");
    std::process::exit(EX_CONFIG);
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("top") {
        std::process::exit(top::run(&args[1..]));
    }
    let cpus = sys::allowed_cpus().unwrap_or_else(|e| {
        eprintln!("combd: cannot read the CPUs this process may use: {e}");
        std::process::exit(EX_SOFTWARE);
    });
    let (command, settings) = match Settings::load(|k| std::env::var(k).ok(), &args, cpus.len()) {
        Ok(v) => v,
        Err(e) => config_fail(e),
    };
    match command {
        Command::Help => {
            print!("{}", help_text());
            return;
        }
        Command::Version => {
            println!("combd {}", env!("CARGO_PKG_VERSION"));
            return;
        }
        Command::Run | Command::CheckConfig => {}
    }

    let filter = tracing_subscriber::EnvFilter::try_new(&settings.log).unwrap_or_else(|e| {
        config_fail(format_args!(
            "COMBD_LOG: {:?} is not a log filter: {e}",
            settings.log
        ))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();

    let nofile = sys::raise_nofile_limit().unwrap_or_else(|e| {
        warn!("cannot raise RLIMIT_NOFILE: {e}");
        1024
    });
    let max_conns = settings.max_conns_effective(nofile);
    if max_conns < settings.max_conns {
        info!(
            configured = settings.max_conns,
            effective = max_conns,
            rlimit_nofile = nofile,
            "COMBD_MAX_CONNS clamped to the file-descriptor limit"
        );
    }
    if let Err(e) = std::fs::create_dir_all(&settings.data_dir) {
        config_fail(format_args!(
            "COMBD_DATA: cannot create {}: {e}",
            settings.data_dir.display()
        ));
    }

    let probe = MemoryProbe::discover(settings.memory_budget_bytes).unwrap_or_else(|e| {
        eprintln!("combd: cannot read /proc/meminfo: {e}");
        std::process::exit(EX_SOFTWARE);
    });
    info!(
        budget_bytes = probe.budget_bytes,
        source = probe.budget_source.as_str(),
        cgroup = ?probe.cgroup.as_ref().map(|(v, d)| format!("{v:?} {}", d.display())),
        "memory budget"
    );

    let shards = settings.shards;
    let outbound_budget = settings
        .outbound_budget_bytes
        .unwrap_or(probe.budget_bytes / 4 / shards.max(1) as u64)
        .max(1);
    let test_apps = settings.test_apps;
    if command == Command::CheckConfig {
        check_config(&settings, &probe, nofile, max_conns, shards);
        return;
    }
    let (wake_coordinator, coordinator_wakes) = std::sync::mpsc::sync_channel(1);
    let tls = match &settings.tls {
        Some(t) => match combd_shards::tls::Tls::new(t.cert.clone(), t.key.clone()) {
            Ok(tls) => Some(tls),
            Err(e) => config_fail(e),
        },
        None => None,
    };
    let config = NodeConfig {
        settings,
        apps: apps::builtin(test_apps),
        max_conns_effective: max_conns,
        memory_budget_source: probe.budget_source.as_str(),
        outbound_budget_bytes: outbound_budget,
        coordinator: wake_coordinator,
        tls,
    };
    let node = match Node::start(config, &cpus) {
        Ok(node) => node,
        Err(e) if e.starts_with("COMBD_") => config_fail(e),
        Err(e) => {
            eprintln!("combd: {e}");
            std::process::exit(EX_SOFTWARE);
        }
    };
    let shared = node.shared().clone();
    let coordinator = std::thread::Builder::new()
        .name("combd-coordinator".into())
        .spawn(move || coordinator::run(shared, probe, coordinator_wakes))
        .unwrap_or_else(|e| {
            eprintln!("combd: cannot start the coordinator: {e}");
            std::process::exit(EX_SOFTWARE);
        });
    info!(public = %node.public_addr(), local = %node.local_addr(), shards, max_conns, "serving");
    // One line on stdout that scripts and tests wait for.
    println!(
        "combd ready: public={} local={} shards={shards}{}",
        node.public_addr(),
        node.local_addr(),
        node.tls_addr()
            .map(|a| format!(" tls={a}"))
            .unwrap_or_default()
    );
    let _ = std::io::stdout().flush();
    notify::notify(&format!(
        "READY=1\nSTATUS=serving on {} with {shards} shard(s)",
        node.public_addr()
    ));

    let drain = node.drain_handle();
    let shared = node.shared().clone();
    match signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP]) {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                let mut draining = false;
                for sig in signals.forever() {
                    if sig == SIGHUP {
                        // Reload the certificate and key; a bad pair keeps the old one.
                        match shared.tls.as_ref().map(|t| t.reload()) {
                            Some(Ok(())) => info!("SIGHUP: TLS certificate and key reloaded"),
                            Some(Err(e)) => error!("SIGHUP: keeping the old TLS certificate: {e}"),
                            None => info!("SIGHUP: TLS is off, nothing to reload"),
                        }
                    } else if !draining {
                        draining = true;
                        info!(signal = sig, "draining");
                        notify::notify("STOPPING=1");
                        drain.drain();
                    } else {
                        warn!("second signal: exiting without waiting for the drain");
                        std::process::exit(EX_SOFTWARE);
                    }
                }
            });
        }
        Err(e) => warn!("cannot install signal handlers: {e}"),
    }

    let result = node.wait();
    let _ = coordinator.join();
    match result {
        Ok(()) => info!("stopped"),
        Err(e) => {
            eprintln!("combd: {e}");
            std::process::exit(EX_SOFTWARE);
        }
    }
}

/// `--check-config`: every setting's effective value and where it came from, then what was
/// derived from the machine, then the fixed limits.
fn check_config(
    settings: &Settings,
    probe: &MemoryProbe,
    nofile: u64,
    max_conns: u64,
    shards: usize,
) {
    use combd_kernel::settings::Source;
    println!(
        "combd {}: the settings are valid.\n",
        env!("CARGO_PKG_VERSION")
    );
    println!("{:<24} {:<28} source", "setting", "value");
    for (name, value, source) in settings.describe() {
        let source = match source {
            Source::Default => "default",
            Source::Env => "env",
            Source::Flag => "flag",
        };
        println!("{name:<24} {value:<28} {source}");
    }
    println!("\nin force:");
    let clamp = if max_conns < settings.max_conns {
        format!("clamped to RLIMIT_NOFILE {nofile} less 256")
    } else {
        "COMBD_MAX_CONNS".to_string()
    };
    println!("{:<24} {:<28} {clamp}", "max_conns", max_conns);
    println!(
        "{:<24} {:<28} {}",
        "memory_budget_bytes",
        probe.budget_bytes,
        probe.budget_source.as_str()
    );
    let outbound = settings
        .outbound_budget_bytes
        .unwrap_or(probe.budget_bytes / 4 / shards.max(1) as u64);
    let from = if settings.outbound_budget_bytes.is_some() {
        "COMBD_OUTBOUND_BUDGET"
    } else {
        "memory budget / 4 / shards"
    };
    println!("{:<24} {:<28} {from}", "outbound_budget_bytes", outbound);
    println!(
        "\nfixed limits (kernel/src/limits.rs): header section {} B, header fields {}, request target {} B, \
         mailbox {}, batch {}, session mailbox {} ({} while behind), slow reader {} B, sends {} B a call, \
         SQL statement {} ms, SQL per call {} ms, SQL value {} B, log {} B a call",
        limits::HEADER_SECTION_MAX_BYTES,
        limits::HEADER_COUNT_MAX,
        limits::URL_MAX_BYTES,
        limits::MAILBOX_DEFAULT,
        limits::BATCH_DEFAULT,
        limits::SESSION_MAILBOX,
        limits::SESSION_MAILBOX_BEHIND,
        limits::WS_SLOW_CLOSE_BYTES,
        limits::SENDS_MAX_BYTES,
        limits::SQL_STATEMENT_LIMIT.as_millis(),
        limits::HOST_TIME_LIMIT.as_millis(),
        limits::SQL_VALUE_MAX_BYTES,
        limits::LOG_MAX_BYTES
    );
}
