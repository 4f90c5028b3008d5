//! The module of a `host_imports` script, as WebAssembly text: every import the node offers
//! (and three WASI ones it does not), the dictionary's strings in data segments, and the
//! script's calls with their arguments as constants, loops and expressions
//! ([`super::imports`]). The node compiles `.wat` itself, so this is what it deploys.
//!
//! The dictionary holds texts and `iovec`s for the arguments, SQL an app may run, and SQL it
//! must not be able to: attaching or vacuuming into files (in the directory the harness
//! watches, the node's data directory, relative to its working directory), transaction
//! control, pragmas that write, temporary and virtual tables, extensions, the schema table.
//! A `sql` call given exactly such a statement checks its answer: if the statement ran, the
//! module fails the input with 599 `escaped: <statement>`, which the harness reports.

use std::fmt::Write;
use std::path::PathBuf;

use super::imports::{Arg, Call, Script, A32, IMPORTS};

/// Where the harness's files are, for the dictionary's paths.
#[derive(Debug, Clone)]
pub struct Paths {
    /// A directory the node may not write to (its working directory and `TMPDIR`).
    pub out: PathBuf,
    /// The node's data directory.
    pub data: PathBuf,
}

/// What a dictionary entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Bytes for arguments and bodies.
    Text,
    /// SQL an app may run (it may still fail, or meet a limit).
    Sql,
    /// SQL the node must refuse: the statement never runs (its `sql` answers -1).
    MustFail,
}

/// One string of the dictionary.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Its bytes (paths filled in; an `iovec`'s addresses laid out).
    pub bytes: Vec<u8>,
    /// What it is.
    pub class: Class,
}

/// Where an `iovec` points.
enum IovPtr {
    /// At entry `k` of [`SOURCES`].
    Entry(usize),
    /// At this address.
    Raw(i32),
}

enum Source {
    Text(&'static [u8]),
    Sql(&'static str),
    MustFail(&'static str),
    /// `iovec`s: where each points and its length (`None`: the entry's length).
    Iov(&'static [(IovPtr, Option<i32>)]),
}

use Source::{Iov, MustFail, Sql, Text};

/// The dictionary, by index. New entries go at the end (the corpus names entries by index).
const SOURCES: &[Source] = &[
    Text(b"{\"ok\":1}"),
    Text(b"hello"),
    Text(b"t"),
    Text(b""),
    Text(b"\xff\xfe\xc3 not UTF-8"),
    Iov(&[(IovPtr::Entry(1), None)]),
    Iov(&[(IovPtr::Entry(0), None), (IovPtr::Entry(1), None)]),
    Iov(&[(IovPtr::Raw(-1), Some(5))]),
    Iov(&[(IovPtr::Entry(1), Some(i32::MAX))]),
    Text(b"{}"),
    Text("snowman \u{2603} and \u{1f600}".as_bytes()),
    Text(b"SELECT 1\0; ATTACH DATABASE '{out}/nul.sqlite' AS n"),
    Sql("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v)"),
    Sql("INSERT INTO t (v) VALUES (?1)"),
    Sql("SELECT k, v FROM t ORDER BY k"),
    Sql("SELECT count(*), total(length(v)) FROM t"),
    Sql("UPDATE t SET v = ?1 WHERE k = ?2 RETURNING k, v"),
    Sql("DELETE FROM t WHERE k % 2 = 0"),
    Sql("SELECT ?1, ?2, ?3, ?4, ?5"),
    Sql("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c) SELECT i, zeroblob(1000) FROM c"),
    Sql("WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 10000000) SELECT sum(i) FROM c"),
    Sql("SELECT zeroblob(3000000)"),
    Sql("INSERT INTO t (v) SELECT zeroblob(100000) FROM (WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c LIMIT 20) SELECT i FROM c)"),
    Sql("CREATE TABLE IF NOT EXISTS u (x, y)"),
    Sql("CREATE INDEX IF NOT EXISTS tv ON t (v)"),
    Sql("DROP TABLE IF EXISTS u"),
    Sql("PRAGMA user_version = 7"),
    Sql("PRAGMA integrity_check"),
    Sql("SELECT name, sql FROM sqlite_master"),
    Sql("CREATE TRIGGER IF NOT EXISTS tr AFTER INSERT ON t BEGIN UPDATE t SET v = v WHERE k = new.k; END"),
    Sql("CREATE VIEW IF NOT EXISTS vw AS SELECT * FROM t"),
    Sql("SELECT * FROM t WHERE v = ?1"),
    Sql("SELECT 1; ATTACH DATABASE '{out}/tail.sqlite' AS tail"),
    Sql("INSERT INTO t (v) VALUES (randomblob(?1))"),
    Sql("SELECT * FROM dbstat"),
    Sql("ALTER TABLE t ADD COLUMN w"),
    Sql("CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v); INSERT INTO t (v) VALUES ('from the schema')"),
    Sql("SELECT * FROM pragma_table_info('t')"),
    MustFail("ATTACH DATABASE '{out}/attach.sqlite' AS x"),
    MustFail("ATTACH DATABASE '{data}/objects/counter/victim.sqlite' AS v"),
    MustFail("ATTACH DATABASE '{data}/objects/fz/sibling.sqlite' AS s"),
    MustFail("ATTACH DATABASE 'file:{out}/uri.sqlite?mode=rwc' AS u"),
    MustFail("ATTACH DATABASE 'relative.sqlite' AS r"),
    MustFail("ATTACH ':memory:' AS m"),
    MustFail("VACUUM INTO '{out}/vacuum.sqlite'"),
    MustFail("VACUUM INTO 'relative-vacuum.sqlite'"),
    MustFail("VACUUM"),
    MustFail("DETACH DATABASE main"),
    MustFail("BEGIN"),
    MustFail("BEGIN IMMEDIATE"),
    MustFail("COMMIT"),
    MustFail("END"),
    MustFail("ROLLBACK"),
    MustFail("SAVEPOINT s"),
    MustFail("RELEASE s"),
    MustFail("ROLLBACK TO s"),
    MustFail("PRAGMA journal_mode = DELETE"),
    MustFail("PRAGMA journal_mode = OFF"),
    MustFail("PRAGMA synchronous = OFF"),
    MustFail("PRAGMA writable_schema = ON"),
    MustFail("PRAGMA max_page_count = 1"),
    MustFail("PRAGMA cache_size = -1000000"),
    MustFail("PRAGMA mmap_size = 1073741824"),
    MustFail("PRAGMA temp_store_directory = '{out}'"),
    MustFail("PRAGMA locking_mode = EXCLUSIVE"),
    MustFail("PRAGMA wal_checkpoint(TRUNCATE)"),
    MustFail("PRAGMA database_list"),
    MustFail("PRAGMA trusted_schema = ON"),
    MustFail("PRAGMA query_only = 1"),
    MustFail("PRAGMA temp.user_version = 1"),
    MustFail("SELECT * FROM pragma_database_list"),
    MustFail("CREATE TEMP TABLE tt (x)"),
    MustFail("CREATE TABLE temp.tt (x)"),
    MustFail("CREATE VIRTUAL TABLE vt USING fts5(x)"),
    MustFail("CREATE VIRTUAL TABLE vr USING rtree(id, a, b)"),
    MustFail("SELECT load_extension('{out}/evil')"),
    MustFail("INSERT INTO sqlite_master VALUES ('table', 'x', 'x', 0, 'CREATE TABLE x (a)')"),
    MustFail("UPDATE sqlite_master SET sql = 'x'"),
    MustFail("SELECT * FROM sqlite_temp_master"),
    MustFail("CREATE TABLE IF NOT EXISTS leak AS SELECT * FROM pragma_database_list"),
    MustFail("PRAGMA foreign_keys = OFF"),
];

/// Where the dictionary starts in the module's memory; below it is scratch space.
pub const DICTIONARY_AT: u32 = 4096;

/// The dictionary with `paths` filled in, laid out from [`DICTIONARY_AT`]: each entry, and
/// where it is.
pub fn dictionary(paths: &Paths) -> Vec<(u32, Entry)> {
    let fill = |s: &[u8]| {
        String::from_utf8_lossy(s)
            .replace("{out}", &paths.out.display().to_string())
            .replace("{data}", &paths.data.display().to_string())
            .into_bytes()
    };
    let mut entries: Vec<Entry> = SOURCES
        .iter()
        .map(|s| match s {
            // Not through `fill`, which would mend the bytes that are not UTF-8.
            Text(b) if std::str::from_utf8(b).is_err() => Entry {
                bytes: b.to_vec(),
                class: Class::Text,
            },
            Text(b) => Entry {
                bytes: fill(b),
                class: Class::Text,
            },
            Sql(t) => Entry {
                bytes: fill(t.as_bytes()),
                class: Class::Sql,
            },
            MustFail(t) => Entry {
                bytes: fill(t.as_bytes()),
                class: Class::MustFail,
            },
            // An iovec is 8 bytes a buffer: laid out below, once addresses are known.
            Iov(v) => Entry {
                bytes: vec![0; 8 * v.len()],
                class: Class::Text,
            },
        })
        .collect();
    let mut at = Vec::with_capacity(entries.len());
    let mut next = DICTIONARY_AT;
    for e in &entries {
        at.push(next);
        // Each is NUL-terminated (a schema is read to its NUL) and 8-aligned.
        next = (next + e.bytes.len() as u32 + 1).next_multiple_of(8);
    }
    for (i, s) in SOURCES.iter().enumerate() {
        if let Iov(v) = s {
            let mut bytes = Vec::new();
            for (ptr, len) in v.iter() {
                let (p, n) = match ptr {
                    IovPtr::Entry(k) => (at[*k] as i32, entries[*k].bytes.len() as i32),
                    IovPtr::Raw(p) => (*p, 0),
                };
                bytes.extend(p.to_le_bytes());
                bytes.extend(len.unwrap_or(n).to_le_bytes());
            }
            entries[i].bytes = bytes;
        }
    }
    at.into_iter().zip(entries).collect()
}

/// The text of the message a module fails with when must-fail entry `k` ran.
pub fn escaped(k: usize, entry: &Entry) -> String {
    format!(
        "escaped: dictionary entry {k} ran: {}",
        String::from_utf8_lossy(&entry.bytes)
    )
}

/// The module of `script`, as WebAssembly text. `serial` goes in its memory, so every
/// script's module is a new version for the node.
pub fn wat(script: &Script, serial: u64, dict: &[(u32, Entry)]) -> String {
    let m = &script.module;
    let mut w = String::from("(module\n");
    for (i, (module, name, params, result)) in IMPORTS.iter().enumerate() {
        let _ = write!(w, "  (import \"{module}\" \"{name}\" (func $i{i}");
        if !params.is_empty() {
            w.push_str(" (param");
            for p in params.iter() {
                w.push(' ');
                w.push_str(ty(*p));
            }
            w.push(')');
        }
        if let Some(r) = result {
            let _ = write!(w, " (result {})", ty(*r));
        }
        w.push_str("))\n");
    }
    let max = m.max_pages.map(|x| format!(" {x}")).unwrap_or_default();
    let _ = writeln!(w, "  (memory (export \"memory\") {}{max})", m.pages);
    let _ = writeln!(w, "  (data (i32.const 0) \"host_imports script {serial}\")");
    let mut next = 0;
    for (at, e) in dict {
        let _ = writeln!(w, "  (data (i32.const {at}) \"{}\")", escape(&e.bytes));
        next = at + e.bytes.len() as u32 + 1;
    }
    // The escape messages, after the dictionary.
    let mut messages = Vec::new();
    for (k, (_, e)) in dict.iter().enumerate() {
        if e.class == Class::MustFail {
            let text = escaped(k, e);
            let _ = writeln!(
                w,
                "  (data (i32.const {next}) \"{}\")",
                escape(text.as_bytes())
            );
            messages.push((k, next, text.len()));
            next = (next + text.len() as u32 + 1).next_multiple_of(8);
        }
    }
    let body = |calls: &[Call], code: i32| {
        let mut f = String::from(
            "(result i32)\n    (local $last i32) (local $last64 i64) (local $n i32)\n",
        );
        for (i, c) in calls.iter().enumerate() {
            call(&mut f, i, c, dict, &messages);
        }
        let _ = writeln!(f, "    (i32.const {code}))");
        f
    };
    let _ = write!(w, "  (func $body {}", body(&m.handle, m.code));
    let _ = write!(w, "  (func $side {}", body(&m.side, 0));
    w.push_str("  (func (export \"handle\") (result i32) (call $body))\n");
    if m.batch {
        let select = super::imports::import("select");
        let _ = write!(
            w,
            "  (func (export \"handle_batch\") (param $count i32) (result i32)\n\
             \x20   (local $i i32) (local $r i32)\n\
             \x20   (block $done (loop $each\n\
             \x20     (br_if $done (i32.ge_s (local.get $i) (local.get $count)))\n\
             \x20     (drop (call $i{select} (local.get $i)))\n\
             \x20     (local.set $r (call $body))\n\
             \x20     (br_if $done (local.get $r))\n\
             \x20     (local.set $i (i32.add (local.get $i) (i32.const 1)))\n\
             \x20     (br $each)))\n\
             \x20   (local.get $r))\n",
        );
    }
    if let Some(kb) = m.memory_kb {
        let _ = writeln!(
            w,
            "  (func (export \"memory_kb\") (result i32) (i32.const {kb}))"
        );
    }
    if let Some(k) = m.schema {
        let at = dict[usize::from(k) % dict.len()].0;
        let _ = writeln!(
            w,
            "  (func (export \"schema\") (result i32) (i32.const {at}))"
        );
    }
    if let Some(ret) = m.topic {
        let at = ret.map_or(0, |k| dict[usize::from(k) % dict.len()].0);
        let _ = writeln!(
            w,
            "  (func (export \"topic\") (result i32) (drop (call $side)) (i32.const {at}))"
        );
    }
    if m.init {
        w.push_str("  (func (export \"_initialize\") (drop (call $side)))\n");
    }
    if m.resync {
        w.push_str("  (func (export \"resync\") (result i32) (i32.const 1))\n");
    }
    w.push_str(")\n");
    w
}

fn ty(t: super::imports::Ty) -> &'static str {
    match t {
        super::imports::Ty::I32 => "i32",
        super::imports::Ty::I64 => "i64",
        super::imports::Ty::F64 => "f64",
    }
}

/// Bytes as a WebAssembly text string: every byte escaped.
fn escape(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(bytes.len() * 3);
    for b in bytes {
        let _ = write!(s, "\\{b:02x}");
    }
    s
}

/// Appends call `i` of a function: the import called (its `i32` answer kept for
/// [`A32::Last`]), in a loop when repeated, and the escape check after a must-fail `sql`.
fn call(
    f: &mut String,
    i: usize,
    c: &Call,
    dict: &[(u32, Entry)],
    messages: &[(usize, u32, usize)],
) {
    let (import, args, times) = match c {
        Call::Grow(a) => {
            let _ = writeln!(f, "    (local.set $last (memory.grow {}))", a32(*a, dict));
            return;
        }
        Call::Import {
            import,
            args,
            times,
        } => (usize::from(*import) % IMPORTS.len(), args, (*times).max(1)),
    };
    let mut e = format!("(call $i{import}");
    for a in args {
        e.push(' ');
        e.push_str(&match *a {
            Arg::I32(a) => a32(a, dict),
            Arg::I64(Some(v)) => format!("(i64.const {v})"),
            Arg::I64(None) => format!("(call $i{})", super::imports::import("session_id")),
            Arg::F64(bits) => format!("(f64.reinterpret_i64 (i64.const {}))", bits as i64),
        });
    }
    e.push(')');
    let stmt = match IMPORTS[import].3 {
        Some(super::imports::Ty::I32) => format!("(local.set $last {e})"),
        Some(super::imports::Ty::I64) => format!("(local.set $last64 {e})"),
        Some(super::imports::Ty::F64) => format!("(drop {e})"),
        None => e,
    };
    if times > 1 {
        let _ = writeln!(
            f,
            "    (local.set $n (i32.const {times}))\n    (loop $r{i}\n      {stmt}\n      \
             (br_if $r{i} (i32.gt_s (local.tee $n (i32.sub (local.get $n) (i32.const 1))) \
             (i32.const 0))))"
        );
    } else {
        let _ = writeln!(f, "    {stmt}");
    }
    // `sql` of exactly a must-fail statement: it must have answered -1.
    if IMPORTS[import].1 == "sql" {
        if let [Arg::I32(A32::Start(a)), Arg::I32(A32::Len(b))] = args[..] {
            let k = usize::from(a) % dict.len();
            if usize::from(b) % dict.len() == k {
                if let Some((_, at, len)) = messages.iter().find(|(m, _, _)| *m == k) {
                    let fail = super::imports::import("fail");
                    let _ = writeln!(
                        f,
                        "    (if (i32.ge_s (local.get $last) (i32.const 0)) (then \
                         (call $i{fail} (i32.const 599) (i32.const {at}) (i32.const {len})) \
                         (return (i32.const 1))))"
                    );
                }
            }
        }
    }
}

/// An `i32` argument as an expression.
fn a32(a: A32, dict: &[(u32, Entry)]) -> String {
    let entry = |k: u8| &dict[usize::from(k) % dict.len()];
    match a {
        A32::Const(v) => format!("(i32.const {v})"),
        A32::Start(k) => format!("(i32.const {})", entry(k).0),
        A32::Len(k) => format!("(i32.const {})", entry(k).1.bytes.len()),
        A32::End(k) => format!("(i32.const {})", entry(k).0 + entry(k).1.bytes.len() as u32),
        A32::MemEnd(d) => {
            format!("(i32.add (i32.mul (memory.size) (i32.const 65536)) (i32.const {d}))")
        }
        A32::Last => "(local.get $last)".to_string(),
        A32::Shard => format!("(call $i{})", super::imports::import("session_shard")),
    }
}

/// The index of the dictionary entry written as `template` (before its paths are filled
/// in), for the named seeds.
pub fn find<T: AsRef<[u8]> + ?Sized>(template: &T) -> u8 {
    let template = template.as_ref();
    SOURCES
        .iter()
        .position(|s| match s {
            Text(b) => *b == template,
            Sql(t) | MustFail(t) => t.as_bytes() == template,
            Iov(_) => false,
        })
        .unwrap_or_else(|| {
            panic!(
                "no dictionary entry {:?}",
                String::from_utf8_lossy(template)
            )
        }) as u8
}

/// The indices of the dictionary's must-fail statements.
pub fn must_fail() -> Vec<u8> {
    (0..SOURCES.len())
        .filter(|&i| matches!(SOURCES[i], MustFail(_)))
        .map(|i| i as u8)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::imports::{decode, import, Module};
    use super::*;

    fn dict() -> Vec<(u32, Entry)> {
        dictionary(&Paths {
            out: "/tmp/out-dir".into(),
            data: "/tmp/data-dir".into(),
        })
    }

    #[test]
    fn the_dictionary_and_its_messages_fit_the_first_page_with_paths_filled_in() {
        let d = dict();
        let mut end = DICTIONARY_AT;
        for (k, (at, e)) in d.iter().enumerate() {
            assert!(*at >= end, "entry {k} overlaps the one before");
            end = at + e.bytes.len() as u32 + 1;
            let text = String::from_utf8_lossy(&e.bytes);
            assert!(
                !text.contains("{out}") && !text.contains("{data}"),
                "{text}"
            );
        }
        let messages: usize = d
            .iter()
            .enumerate()
            .filter(|(_, (_, e))| e.class == Class::MustFail)
            .map(|(k, (_, e))| escaped(k, e).len() + 8)
            .sum();
        assert!(
            end as usize + messages < 65536,
            "the dictionary ends at {end}"
        );
        assert_eq!(d[usize::from(find("hello"))].1.bytes, b"hello");
        assert!(String::from_utf8_lossy(
            &d[usize::from(find("VACUUM INTO '{out}/vacuum.sqlite'"))]
                .1
                .bytes
        )
        .contains("/tmp/out-dir/vacuum.sqlite"));
        // The first iovec points at "hello", five bytes.
        let hello = d[usize::from(find("hello"))].0 as i32;
        assert_eq!(
            d[5].1.bytes,
            [hello.to_le_bytes(), 5i32.to_le_bytes()].concat()
        );
    }

    #[test]
    fn a_must_fail_statement_run_exactly_is_checked() {
        let k = must_fail()[0];
        let sql = |a: A32, b: A32| Call::Import {
            import: import("sql"),
            args: vec![Arg::I32(a), Arg::I32(b)],
            times: 1,
        };
        let script = |calls| Script {
            module: Module {
                pages: 1,
                handle: calls,
                ..Module::default()
            },
            ..decode(&[])
        };
        let d = dict();
        let checked = wat(&script(vec![sql(A32::Start(k), A32::Len(k))]), 1, &d);
        assert!(checked.contains("(i32.const 599)"), "{checked}");
        let prefix = wat(&script(vec![sql(A32::Start(k), A32::Const(3))]), 1, &d);
        assert!(!prefix.contains("(i32.const 599)"));
        let allowed = find("SELECT k, v FROM t ORDER BY k");
        let fine = wat(
            &script(vec![sql(A32::Start(allowed), A32::Len(allowed))]),
            1,
            &d,
        );
        assert!(!fine.contains("(i32.const 599)"));
    }
}
