//! A real SQLite database in WAL mode, written the way an object's is, and what the tests
//! compare restored databases by.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

/// A database in `dir` in WAL mode with automatic checkpoints off (the commit task checkpoints
/// after shipping), holding one table `t(id INTEGER PRIMARY KEY, v TEXT, b BLOB)`.
pub struct Db {
    pub conn: Connection,
    pub path: PathBuf,
}

impl Db {
    pub fn create(dir: &Path) -> Db {
        let db = Db::open(&dir.join("object.sqlite"));
        db.conn
            .execute_batch("CREATE TABLE t(id INTEGER PRIMARY KEY, v TEXT NOT NULL, b BLOB);")
            .unwrap();
        db
    }

    /// Opens (or creates) the database at `path` as an object's: WAL, no automatic checkpoint.
    pub fn open(path: &Path) -> Db {
        let conn = Connection::open(path).unwrap();
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=0;",
        )
        .unwrap();
        Db {
            conn,
            path: path.to_path_buf(),
        }
    }

    pub fn wal_path(&self) -> PathBuf {
        let mut p = self.path.clone().into_os_string();
        p.push("-wal");
        PathBuf::from(p)
    }

    /// Copies every frame into the database and empties the WAL (the next write starts a new
    /// WAL generation, with new salts).
    pub fn checkpoint(&self) {
        let (busy, _, _): (i64, i64, i64) = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                Ok((r.get(0)?, r.get(1)?, r.get(2)?))
            })
            .unwrap();
        assert_eq!(busy, 0, "the checkpoint was blocked");
    }

    /// The database file's bytes after a checkpoint: a snapshot.
    pub fn snapshot(&self) -> Vec<u8> {
        self.checkpoint();
        std::fs::read(&self.path).unwrap()
    }

    /// Runs `sql` as one transaction.
    pub fn commit(&self, sql: &str) {
        self.conn
            .execute_batch(&format!("BEGIN IMMEDIATE; {sql}; COMMIT;"))
            .unwrap();
    }
}

/// Every row of `t`, in order, as text (blobs by length and a checksum).
pub fn rows(conn: &Connection) -> Vec<String> {
    let mut st = conn
        .prepare("SELECT id, v, length(b), coalesce(hex(substr(b, 1, 8)), '') FROM t ORDER BY id")
        .unwrap();
    st.query_map([], |r| {
        Ok(format!(
            "{}|{}|{:?}|{}",
            r.get::<_, i64>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Option<i64>>(2)?,
            r.get::<_, String>(3)?
        ))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

/// Opens a restored database file and checks it: `PRAGMA integrity_check` must say `ok`.
pub fn open_checked(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    let check: String = conn
        .query_row("PRAGMA integrity_check", [], |r| r.get(0))
        .unwrap();
    assert_eq!(check, "ok", "integrity_check of {}", path.display());
    conn
}
