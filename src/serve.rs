//! The node's start-up, the signal that drains it, and its exit codes: what the `combd`
//! binary (`src/main.rs`) runs, and the test node (`src/bin/combd-test-node.rs`) with the test
//! apps added.
//!
//! Exit codes: 0 after a clean drain; 78 (EX_CONFIG) for a setting that is invalid or cannot be
//! served, after one line naming it; 70 (EX_SOFTWARE) when anything else fails (a shard, the
//! machine's files). Every failure is a `Failure`; `failure::exit_status` is the one place
//! that maps it to a status, and `failure::fail` the one place that reports it and exits.

use std::io::{IsTerminal as _, Write};
use std::path::Path;

use combd_kernel::limits;
use combd_kernel::memory::MemoryProbe;
use combd_kernel::settings::{check_env_names, help_text, Command, Settings, Show as _, Source};
use combd_kernel::sys;
use combd_shards::access_log::{AccessLog, Sink};
use combd_shards::app::Apps;
use combd_shards::{Node, NodeConfig, StartError};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use tracing::{error, info, warn};

use crate::failure::{fail, Failure};
use crate::{apps, check, coordinator, new, notify, objects, restore, token, top};

/// Runs the node (or its `top`, `token`, `--check-config`, `--help` and `--version`) with the
/// built-in apps ([`apps::builtin`]) and those `extra` registers beside them, before the
/// deployed modules; the process's exit status says how it ended.
pub fn main(extra: fn(&Apps)) {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("top") => std::process::exit(top::run(&args[1..])),
        Some("token") => std::process::exit(token::run(&args[1..])),
        Some("objects") => std::process::exit(objects::run(&args[1..])),
        Some("restore") => std::process::exit(restore::run(&args[1..])),
        Some("new") => std::process::exit(new::run(&args[1..])),
        _ => {}
    }
    // Output to stdout stops quietly when its reader goes away (`combd --help | head -1`):
    // every write is checked, none panics.
    let mut stdout = std::io::stdout();
    let Some((command, settings, cpus)) = read_settings(&args, &mut stdout) else {
        return;
    };
    start_logging(&settings);
    let running = command == Command::Run;
    let machine = Machine::find(&settings, running);
    let parts = Parts::make(&settings, running, extra);
    if command == Command::CheckConfig {
        // Every check of a start has run but those a running node would fail (its data
        // directory's lock, its ports). The report stops quietly on a closed stdout.
        let _ = check::report(
            &mut stdout,
            &settings,
            &machine.probe,
            machine.nofile,
            machine.max_conns,
            settings.shards,
        )
        .and_then(|()| stdout.flush());
        return;
    }
    serve(settings, &cpus, machine, parts, &mut stdout);
}

/// The settings from the environment and `args`, the CPUs the node may use, and whether to
/// run or check them; `None` once `--help` or `--version` printed their answer. A setting that
/// is not valid, or an unknown `COMBD_*` variable, ends the process here.
fn read_settings(
    args: &[String],
    stdout: &mut std::io::Stdout,
) -> Option<(Command, Settings, Vec<usize>)> {
    let cpus = sys::allowed_cpus().unwrap_or_else(|e| {
        fail(Failure::Software(format!(
            "cannot read the CPUs this process may use: {e}"
        )))
    });
    let (command, settings) = Settings::load(|k| std::env::var(k).ok(), args, cpus.len())
        .unwrap_or_else(|e| fail(e.into()));
    match command {
        Command::Help => {
            let _ = write!(stdout, "{}", help_text()).and_then(|()| stdout.flush());
            return None;
        }
        Command::Version => {
            let _ = writeln!(stdout, "combd {}", env!("CARGO_PKG_VERSION"))
                .and_then(|()| stdout.flush());
            return None;
        }
        Command::Run | Command::CheckConfig => {}
    }
    let names: Vec<String> = std::env::vars_os()
        .map(|(name, _)| name.to_string_lossy().into_owned())
        .collect();
    check_env_names(names.iter().map(String::as_str)).unwrap_or_else(|e| fail(e.into()));
    Some((command, settings, cpus))
}

/// Logs to stderr with `COMBD_LOG`'s filter, coloured only on a terminal (a file or the
/// journal gets plain text).
fn start_logging(settings: &Settings) {
    let filter = tracing_subscriber::EnvFilter::try_new(&settings.log).unwrap_or_else(|e| {
        fail(Failure::Config(format!(
            "COMBD_LOG: {:?} is not a log filter: {e}",
            settings.log
        )))
    });
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

/// What start-up found of the machine: the file-descriptor limit, the connections it allows,
/// and the memory budget.
struct Machine {
    nofile: u64,
    max_conns: u64,
    probe: MemoryProbe,
}

impl Machine {
    /// Checks io_uring, the file-descriptor limit, the data directory (created when
    /// `running`, only checked otherwise) and the memory budget; ends the process on what
    /// stops a start.
    fn find(settings: &Settings, running: bool) -> Machine {
        // Where io_uring is refused nothing else matters: say so first, and in a check of the
        // configuration too, which would otherwise call a node that cannot start valid.
        if let Err(refused) = combd_kernel::uring::probe() {
            fail(Failure::Config(refused.to_string()));
        }
        let nofile = sys::raise_nofile_limit().unwrap_or_else(|e| {
            warn!("cannot raise RLIMIT_NOFILE: {e}");
            limits::NOFILE_FALLBACK
        });
        let max_conns = settings.max_conns_effective(nofile);
        // A check of the configuration reports these itself, and creates nothing.
        if running && max_conns < settings.max_conns {
            info!(
                configured = settings.max_conns,
                effective = max_conns,
                rlimit_nofile = nofile,
                "COMBD_MAX_CONNS clamped to the file-descriptor limit"
            );
        }
        if running {
            prepare_data_dir(&settings.data_dir).unwrap_or_else(|f| fail(f));
        } else {
            check::data_dir(&settings.data_dir).unwrap_or_else(|f| fail(f));
        }
        let probe = MemoryProbe::discover(settings.memory_budget_bytes)
            .unwrap_or_else(|e| fail(Failure::Software(format!("cannot read /proc/meminfo: {e}"))));
        if running {
            info!(
                budget_bytes = probe.budget_bytes,
                source = probe.budget_source.as_str(),
                cgroup = ?probe.cgroup.as_ref().map(|(v, d)| format!("{v:?} {}", d.display())),
                "memory budget"
            );
        }
        Machine {
            nofile,
            max_conns,
            probe,
        }
    }
}

/// What the node is started with besides its settings: TLS, the token verifier, the apps
/// (built in and deployed modules), and the access log's sink.
struct Parts {
    tls: Option<combd_shards::tls::Tls>,
    auth: Option<combd_shards::auth::Auth>,
    deployed: (combd_wasm::Deployed, combd_shards::app::Apps),
    access_log: Option<Sink>,
}

impl Parts {
    /// Loads each part, or (when not `running`) checks it without creating anything; ends
    /// the process naming the setting of a part that cannot be had.
    fn make(settings: &Settings, running: bool, extra: fn(&Apps)) -> Parts {
        let tls = settings.tls.as_ref().map(|t| {
            combd_shards::tls::Tls::new(t.cert.clone(), t.key.clone())
                .unwrap_or_else(|e| fail(e.into()))
        });
        let auth = settings.auth.clone().map(|a| {
            combd_shards::auth::Auth::new(a)
                .unwrap_or_else(|e| fail(Failure::Config(format!("COMBD_AUTH_JWT_KEY_FILE: {e}"))))
        });
        let deployed = deploy(settings, running, extra).unwrap_or_else(|f| fail(f));
        let access_log = if running {
            open_access_log(settings).unwrap_or_else(|f| fail(f))
        } else {
            check::access_log(&settings.access_log).unwrap_or_else(|f| fail(f));
            None
        };
        Parts {
            tls,
            auth,
            deployed,
            access_log,
        }
    }
}

/// Starts the node and its coordinator, says it is ready, and serves until a signal drains
/// it; the process ends with the node.
fn serve(
    settings: Settings,
    cpus: &[usize],
    machine: Machine,
    parts: Parts,
    stdout: &mut std::io::Stdout,
) {
    let shards = settings.shards;
    let _data_lock = lock_data_dir(&settings.data_dir).unwrap_or_else(|f| fail(f));
    let access_log = parts.access_log.map(|sink| {
        AccessLog::start(sink, shards).unwrap_or_else(|e| {
            fail(Failure::Software(format!(
                "cannot start the access log's writer: {e}"
            )))
        })
    });
    let (wake_coordinator, coordinator_wakes) = std::sync::mpsc::sync_channel(1);
    let probe = machine.probe;
    let config = NodeConfig {
        outbound_budget_bytes: limits::outbound_budget_per_shard(
            settings.outbound_budget_bytes,
            probe.budget_bytes,
            shards,
        ),
        inbound_budget_bytes: limits::inbound_budget_per_shard(
            settings.inbound_budget_bytes,
            probe.budget_bytes,
            shards,
        ),
        settings,
        apps: parts.deployed.1,
        max_conns_effective: machine.max_conns,
        memory_budget_source: probe.budget_source.as_str(),
        memory_budget_bytes: probe.budget_bytes,
        coordinator: wake_coordinator,
        tls: parts.tls,
        auth: parts.auth,
        access_log: access_log.clone(),
    };
    let node = Node::start(config, cpus).unwrap_or_else(|e: StartError| fail(e.into()));
    let shared = node.shared().clone();
    let coordinator = std::thread::Builder::new()
        .name("combd-coordinator".into())
        .spawn(move || coordinator::run(shared, probe, coordinator_wakes))
        .unwrap_or_else(|e| {
            fail(Failure::Software(format!(
                "cannot start the coordinator: {e}"
            )))
        });
    // The signals are handled before the ready line: a SIGTERM sent as soon as the node said
    // it serves drains it, where the default action would kill it.
    handle_signals(&node, parts.deployed.0);
    say_ready(&node, shards, machine.max_conns, stdout);
    let result = node.wait();
    let _ = coordinator.join();
    // The shards handed over their last lines as they ended: written before the exit.
    if let Some(log) = &access_log {
        log.finish();
    }
    match result {
        Ok(()) => info!("stopped"),
        Err(e) => fail(Failure::Software(e)),
    }
}

/// Tells the log, stdout (one line that scripts and tests wait for; nobody reading it is no
/// failure) and systemd that the node serves.
fn say_ready(node: &Node, shards: usize, max_conns: u64, stdout: &mut std::io::Stdout) {
    info!(public = %node.public_addr(), local = %node.local_addr(), shards, max_conns, "serving");
    let _ = writeln!(
        stdout,
        "combd ready: public={} local={} shards={shards}{}",
        node.public_addr(),
        node.local_addr(),
        node.tls_addr()
            .map(|a| format!(" tls={a}"))
            .unwrap_or_default()
    )
    .and_then(|()| stdout.flush());
    notify::notify(&format!(
        "READY=1\nSTATUS=serving on {} with {shards} shard(s)",
        node.public_addr()
    ));
}

/// Creates the data directory if it is missing and checks that objects can be written under
/// it (a file created and removed in `<data>/objects/`), so that a directory the node cannot
/// write stops the start instead of failing every object request.
fn prepare_data_dir(dir: &Path) -> Result<(), Failure> {
    let config = |m: String| Failure::Config(format!("COMBD_DATA: {m}"));
    if std::fs::metadata(dir).is_ok_and(|m| !m.is_dir()) {
        return Err(config(format!("{} is not a directory", dir.display())));
    }
    let objects = dir.join("objects");
    std::fs::create_dir_all(&objects)
        .map_err(|e| config(format!("cannot create {}: {e}", objects.display())))?;
    let probe = objects.join(format!(".combd-write-check-{}", std::process::id()));
    std::fs::write(&probe, b"")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| config(format!("cannot write in {}: {e}", objects.display())))
}

/// Takes `<data>/combd.lock` for the node's life: two nodes on one data directory would open
/// the same objects' databases, each believing it is their only writer.
fn lock_data_dir(dir: &Path) -> Result<sys::FileLock, Failure> {
    let path = dir.join("combd.lock");
    sys::lock_file(&path).map_err(|e| {
        Failure::Config(if e.kind() == std::io::ErrorKind::WouldBlock {
            let by = sys::lock_holder(&path)
                .map(|pid| format!(" (pid {pid})"))
                .unwrap_or_default();
            format!(
                "COMBD_DATA: {} is in use by another combd{by}, which holds {}",
                dir.display(),
                path.display()
            )
        } else {
            format!("COMBD_DATA: cannot lock {}: {e}", path.display())
        })
    })
}

/// The apps: the built-in ones, then those deployed as modules in `COMBD_APPS_DIR`. A module
/// that does not load, or takes a built-in app's name, stops the start naming its file. Not
/// `running` (`--check-config`): every module is checked the same way, but nothing is written
/// (the compiled-code cache) or logged.
fn deploy(
    settings: &Settings,
    running: bool,
    extra: fn(&Apps),
) -> Result<(combd_wasm::Deployed, Apps), Failure> {
    let config = |m: String| Failure::Config(format!("COMBD_APPS_DIR: {m}"));
    // The default directory may be missing (no modules); one set explicitly must exist, as a
    // typo would otherwise deploy nothing without a word.
    let explicit = settings
        .sources
        .get("COMBD_APPS_DIR")
        .is_some_and(|s| *s != Source::Default);
    if explicit && !settings.apps_dir.is_dir() {
        return Err(config(format!(
            "{} is not a directory (set explicitly; unset it to deploy no modules)",
            settings.apps_dir.display()
        )));
    }
    let load = if running {
        combd_wasm::Deployed::load
    } else {
        combd_wasm::Deployed::check
    };
    let deployed = load(
        &settings.apps_dir,
        &settings.data_dir,
        settings.cpu_limit_ticks,
        settings.module_memory_max_bytes,
    )
    .map_err(|e| config(e.to_string()))?;
    let apps = apps::builtin();
    extra(&apps);
    for app in deployed.apps() {
        let file = app.deployment().map(|d| d.file).unwrap_or_default();
        apps.register(app)
            .map_err(|e| config(format!("{file}: {e}")))?;
    }
    for d in deployed.apps().iter().filter_map(|a| a.deployment()) {
        if running {
            info!(file = %d.file, hash = %d.hash, from_cache = d.from_cache, "module deployed");
        }
    }
    Ok((deployed, apps))
}

/// Opens the access log where `COMBD_ACCESS_LOG` says (`None` when off): a file that cannot
/// be opened for append stops the start, naming the setting.
fn open_access_log(settings: &Settings) -> Result<Option<Sink>, Failure> {
    Sink::open(&settings.access_log).map_err(|e| {
        Failure::Config(format!(
            "COMBD_ACCESS_LOG: cannot open {} for append: {e}",
            settings.access_log.show()
        ))
    })
}

/// SIGHUP's reload of the deployed modules, logged: what changed, what was refused.
fn reload_modules(deployed: &combd_wasm::Deployed, apps: &combd_shards::app::Apps) {
    let r = deployed.reload(apps);
    for app in &r.replaced {
        info!(app = %app, "SIGHUP: new module version in force (live objects take it after their batch)");
    }
    for app in &r.added {
        info!(app = %app, "SIGHUP: module deployed");
    }
    for app in &r.removed {
        warn!(app = %app, "SIGHUP: module removed (its sessions closed, its objects finish what waits)");
    }
    for e in &r.refused {
        error!("SIGHUP: module refused (a deployed app keeps its old version): {e}");
    }
}

/// SIGTERM and SIGINT start the drain (a second one exits at once); SIGHUP reloads the TLS
/// certificate and key, keeping the old pair if the new one is bad, and the deployed modules,
/// and opens the access log's file again (its writer says how that went).
fn handle_signals(node: &Node, deployed: combd_wasm::Deployed) {
    let drain = node.drain_handle();
    let shared = node.shared().clone();
    let mut signals = match signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP]) {
        Ok(signals) => signals,
        Err(e) => return warn!("cannot install signal handlers: {e}"),
    };
    std::thread::spawn(move || {
        let mut draining = false;
        for sig in signals.forever() {
            if sig == SIGHUP {
                match shared.tls.as_ref().map(|t| t.reload()) {
                    Some(Ok(())) => info!("SIGHUP: TLS certificate and key reloaded"),
                    Some(Err(e)) => error!("SIGHUP: keeping the old TLS certificate: {e}"),
                    None => info!("SIGHUP: TLS is off, nothing to reload"),
                }
                match shared.auth.as_ref().map(|a| a.reload()) {
                    Some(Ok(())) => info!("SIGHUP: token key reloaded"),
                    Some(Err(e)) => error!("SIGHUP: keeping the old token key: {e}"),
                    None => {}
                }
                reload_modules(&deployed, &shared.apps);
                if let Some(log) = &shared.access_log {
                    log.reopen();
                }
            } else if !draining {
                draining = true;
                info!(signal = sig, "draining");
                notify::notify("STOPPING=1");
                drain.drain();
            } else {
                fail(Failure::Software(
                    "second signal: exiting without waiting for the drain".into(),
                ));
            }
        }
    });
}
