//! The two renderings of the figures: `/stats` (JSON: node totals and node figures at the top
//! level, then each shard) and `/metrics` (Prometheus text, per-shard series labelled `shard`),
//! both walking [`ShardStats::fields`] and the node's [`NodeFigures`].

use std::fmt::Write as _;

use super::stages::{stages_json, STAGE_NAMES};
use super::{Field, Kind, ShardStats, StageTimes};

/// The version of an app deployed as a module, as `/stats` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Deployment {
    /// The module's file.
    pub file: String,
    /// The module's SHA-256, hex.
    pub hash: String,
    /// When this version was loaded, in milliseconds since the Unix epoch.
    pub loaded_at_unix_ms: u64,
    /// Whether its compiled code came from the cache in the data directory.
    pub from_cache: bool,
    /// The `memory_kb` of its instances.
    pub memory_kb: u64,
    /// What a fresh instance holds: its linear memory's initial size, in bytes.
    pub instance_bytes: u64,
    /// Reloads that replaced the version.
    pub reloads: u64,
    /// Reloads refused (the module did not load; the old version kept).
    pub reloads_refused: u64,
}

/// Node-wide figures that are not sums of shards.
#[derive(Debug, Clone)]
pub struct NodeFigures {
    /// Milliseconds since start.
    pub uptime_ms: u64,
    /// `COMBD_MAX_CONNS` after clamping to the fd limit.
    pub max_conns_effective: u64,
    /// 1 while the node drains for shutdown.
    pub draining: u64,
    /// Where the memory budget came from: `env`, `cgroup2`, `cgroup1` or `ram`.
    pub memory_budget_source: &'static str,
    /// Why the node would be full now: `none`, or reasons joined by `+`.
    pub full_reason: String,
    /// The node-wide gauges and counters: (`/stats` name, metric name, kind, help, value).
    pub figures: Vec<Field>,
    /// Every limit in force: (name, value), shown under `"limits"` in `/stats`.
    pub limits: Vec<(&'static str, u64)>,
    /// Every app, and for one deployed as a module its version in force: `"apps"` in `/stats`.
    pub apps: Vec<(&'static str, Option<Deployment>)>,
    /// Each app's object databases on the node (`"objects"` of its entry in `"apps"`).
    pub objects: Vec<(&'static str, u64)>,
}

/// The `"apps"` object of `/stats`: each app's kind, its object databases, and a module's
/// version in force.
fn apps_json(
    apps: &[(&'static str, Option<Deployment>)],
    objects: &[(&'static str, u64)],
) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    for (name, d) in apps {
        let mut v = match d {
            None => serde_json::json!({ "kind": "native" }),
            Some(d) => serde_json::json!({
                "kind": "wasm",
                "file": d.file,
                "hash": d.hash,
                "loaded_at_unix_ms": d.loaded_at_unix_ms,
                "from_cache": d.from_cache,
                "memory_kb": d.memory_kb,
                "instance_bytes": d.instance_bytes,
                "reloads": d.reloads,
                "reloads_refused": d.reloads_refused,
            }),
        };
        let stored = objects
            .iter()
            .find(|(a, _)| a == name)
            .map_or(0, |(_, n)| *n);
        v["objects"] = stored.into();
        m.insert(name.to_string(), v);
    }
    serde_json::Value::Object(m)
}

/// Renders `/stats`: node totals and node figures at the top level, then `"shards": [...]`.
pub fn render_json(node: &NodeFigures, shards: &[ShardStats]) -> String {
    let mut top = serde_json::Map::new();
    top.insert("version".into(), env!("CARGO_PKG_VERSION").into());
    top.insert("pid".into(), std::process::id().into());
    top.insert("uptime_ms".into(), node.uptime_ms.into());
    top.insert(
        "max_conns_effective".into(),
        node.max_conns_effective.into(),
    );
    top.insert("draining".into(), node.draining.into());
    top.insert(
        "memory_budget_source".into(),
        node.memory_budget_source.into(),
    );
    top.insert("full_reason".into(), node.full_reason.clone().into());
    let limits: serde_json::Map<String, serde_json::Value> = node
        .limits
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .collect();
    top.insert("limits".into(), limits.into());
    top.insert("apps".into(), apps_json(&node.apps, &node.objects));
    for f in &node.figures {
        top.insert(f.0.into(), f.4.into());
    }
    top.insert("shard_count".into(), (shards.len() as u64).into());
    let per: Vec<Vec<Field>> = shards.iter().map(|s| s.fields()).collect();
    if let Some(first) = per.first() {
        for (i, f) in first.iter().enumerate() {
            let total: u64 = per.iter().map(|fs| fs[i].4).sum();
            top.insert(f.0.into(), total.into());
        }
    }
    let list: Vec<serde_json::Value> = per
        .iter()
        .enumerate()
        .map(|(id, fs)| {
            let mut m = serde_json::Map::new();
            m.insert("shard".into(), (id as u64).into());
            for f in fs {
                m.insert(f.0.into(), f.4.into());
            }
            m.insert(
                "stages".into(),
                stages_json(&StageTimes::merged([&shards[id].stages])),
            );
            serde_json::Value::Object(m)
        })
        .collect();
    top.insert(
        "stages".into(),
        stages_json(&StageTimes::merged(shards.iter().map(|s| &s.stages))),
    );
    top.insert("shards".into(), list.into());
    serde_json::Value::Object(top).to_string()
}

/// Renders `/metrics` in the Prometheus text format, each per-shard series labelled `shard`.
pub fn render_metrics(node: &NodeFigures, shards: &[ShardStats]) -> String {
    let mut out = String::new();
    let mut one = |name: &str, kind: &str, help: &str, value: u64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    one(
        "combd_uptime_seconds",
        "gauge",
        "Seconds since the node started.",
        node.uptime_ms / 1000,
    );
    one(
        "combd_max_conns_effective",
        "gauge",
        "Connection cap after clamping to the fd limit.",
        node.max_conns_effective,
    );
    one(
        "combd_draining",
        "gauge",
        "1 while the node drains for shutdown.",
        node.draining,
    );
    let kind_name = |k: Kind| match k {
        Kind::Gauge => "gauge",
        Kind::Counter => "counter",
    };
    for f in &node.figures {
        one(f.1, kind_name(f.2), f.3, f.4);
    }
    let _ = writeln!(
        out,
        "# HELP combd_memory_budget_info Where the memory budget came from.\n# TYPE combd_memory_budget_info gauge\ncombd_memory_budget_info{{source=\"{}\"}} 1",
        node.memory_budget_source
    );
    let _ = writeln!(out, "# HELP combd_limit Every limit in force, by name (the \"limits\" of /stats).\n# TYPE combd_limit gauge");
    for (name, value) in &node.limits {
        let _ = writeln!(out, "combd_limit{{name=\"{name}\"}} {value}");
    }
    let per: Vec<Vec<Field>> = shards.iter().map(|s| s.fields()).collect();
    if let Some(first) = per.first() {
        for (i, f) in first.iter().enumerate() {
            let kind = match f.2 {
                Kind::Gauge => "gauge",
                Kind::Counter => "counter",
            };
            let _ = writeln!(out, "# HELP {} {}\n# TYPE {} {}", f.1, f.3, f.1, kind);
            for (id, fs) in per.iter().enumerate() {
                let _ = writeln!(out, "{}{{shard=\"{}\"}} {}", f.1, id, fs[i].4);
            }
        }
    }
    stages_metrics(&mut out, shards);
    out
}

/// The stages of objects' pipelines as one Prometheus summary per stage and shard: the p50,
/// p90 and p99 (each a bucket's upper bound), the count and the sum, in microseconds.
fn stages_metrics(out: &mut String, shards: &[ShardStats]) {
    let name = "combd_stage_microseconds";
    let _ = writeln!(
        out,
        "# HELP {name} How long inputs spend in each stage of their object's pipeline.\n# TYPE {name} summary"
    );
    for (id, s) in shards.iter().enumerate() {
        for (stage, h) in STAGE_NAMES.iter().zip(StageTimes::merged([&s.stages])) {
            let labels = format!("shard=\"{id}\",stage=\"{stage}\"");
            for q in [0.5, 0.9, 0.99] {
                let v = h.quantile_us(q);
                let _ = writeln!(out, "{name}{{{labels},quantile=\"{q}\"}} {v}");
            }
            let _ = writeln!(out, "{name}_sum{{{labels}}} {}", h.sum_us);
            let _ = writeln!(out, "{name}_count{{{labels}}} {}", h.count());
        }
    }
}
