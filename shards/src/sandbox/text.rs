//! What the authorizer cannot see of an app's statement: the names in its text. SQLite asks
//! the authorizer about an `ALTER TABLE`'s old name only (never the name a rename gives), and
//! about a trigger's table, not what its body writes; so the text of an app's `CREATE` or
//! `ALTER` statement is read here, token by token as SQLite's tokenizer reads it (comments,
//! `"…"`, `[…]`, `` `…` `` and `'…'` names dequoted), for a name of the node's.

use std::borrow::Cow;

/// A token of SQL text: a word or a quoted name (dequoted), or one other character.
#[derive(Debug, PartialEq, Eq)]
enum Token<'a> {
    Name(Cow<'a, str>),
    Other,
}

/// The tokens of `sql`, as SQLite's tokenizer splits them (for what matters here).
struct Tokens<'a> {
    sql: &'a str,
    at: usize,
}

/// A character SQLite takes as part of a word (`sqlite3IsIdChar`).
fn word_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
}

impl<'a> Tokens<'a> {
    fn new(sql: &'a str) -> Tokens<'a> {
        Tokens { sql, at: 0 }
    }

    /// Skips whitespace and comments.
    fn skip(&mut self) {
        let b = self.sql.as_bytes();
        loop {
            match b.get(self.at..) {
                Some([c, ..]) if c.is_ascii_whitespace() => self.at += 1,
                Some([b'-', b'-', ..]) => {
                    self.at = b[self.at..]
                        .iter()
                        .position(|&c| c == b'\n')
                        .map_or(b.len(), |p| self.at + p + 1);
                }
                Some([b'/', b'*', ..]) => {
                    self.at = b[self.at + 2..]
                        .windows(2)
                        .position(|w| w == b"*/")
                        .map_or(b.len(), |p| self.at + 2 + p + 2);
                }
                _ => return,
            }
        }
    }

    /// A quoted name from `self.at` (its opening quote), `close` ending it; a doubled `close`
    /// stands for itself, except in `[…]`.
    fn quoted(&mut self, close: u8) -> Token<'a> {
        let b = self.sql.as_bytes();
        let start = self.at + 1;
        let mut i = start;
        let mut doubled = false;
        while i < b.len() {
            if b[i] == close {
                if close != b']' && b.get(i + 1) == Some(&close) {
                    doubled = true;
                    i += 2;
                    continue;
                }
                break;
            }
            i += 1;
        }
        self.at = (i + 1).min(b.len());
        // Quotes and brackets are ASCII, so `start..i` falls on character boundaries.
        let inner = &self.sql[start..i.min(b.len())];
        Token::Name(if doubled {
            let q = (close as char).to_string();
            Cow::Owned(inner.replace(&q.repeat(2), &q))
        } else {
            Cow::Borrowed(inner)
        })
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = Token<'a>;

    fn next(&mut self) -> Option<Token<'a>> {
        self.skip();
        let b = self.sql.as_bytes();
        let c = *b.get(self.at)?;
        Some(match c {
            b'"' | b'\'' | b'`' => self.quoted(c),
            b'[' => self.quoted(b']'),
            c if word_char(c) => {
                let start = self.at;
                while b.get(self.at).is_some_and(|&c| word_char(c)) {
                    self.at += 1;
                }
                Token::Name(Cow::Borrowed(&self.sql[start..self.at]))
            }
            _ => {
                // One character (a multi-byte one is a word character, above).
                self.at += 1;
                Token::Other
            }
        })
    }
}

/// Whether `name` is one of the node's (`_combd_…`, any case).
fn node_name(name: &str) -> bool {
    name.get(..7)
        .is_some_and(|p| p.eq_ignore_ascii_case("_combd_"))
}

/// Whether `sql` (one statement's text) is a `CREATE` or an `ALTER` that names one of the
/// node's tables anywhere: a rename's new name (`ALTER TABLE x RENAME TO _combd_inbox`), a
/// trigger's body writing one, a foreign key to one. Such a statement is denied to apps
/// (a string naming one in it is taken for a name too: SQLite takes `'…'` as a name there).
pub(super) fn names_a_node_table(sql: &str) -> bool {
    let mut tokens = Tokens::new(sql);
    let schema = match tokens.next() {
        Some(Token::Name(w)) => w.eq_ignore_ascii_case("create") || w.eq_ignore_ascii_case("alter"),
        _ => false,
    };
    schema && tokens.any(|t| matches!(t, Token::Name(n) if node_name(&n)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_read_as_sqlite_reads_them() {
        let names = |sql: &str| -> Vec<String> {
            Tokens::new(sql)
                .filter_map(|t| match t {
                    Token::Name(n) => Some(n.into_owned()),
                    Token::Other => None,
                })
                .collect()
        };
        assert_eq!(
            names("ALTER /* a */ TABLE \"x\"\"y\" -- c\n RENAME TO [_combd_in\"box];"),
            ["ALTER", "TABLE", "x\"y", "RENAME", "TO", "_combd_in\"box"]
        );
        assert_eq!(names("a.`b``c`.'d''e' é"), ["a", "b`c", "d'e", "é"]);
        assert_eq!(names("x /* never closed"), ["x"]);
        assert_eq!(names("'never closed"), ["never closed"]);
    }

    #[test]
    fn a_create_or_alter_naming_a_node_table_is_told() {
        for sql in [
            "ALTER TABLE x RENAME TO _combd_inbox",
            "alter table main.x rename to \"_COMBD_inbox\"",
            "ALTER TABLE x RENAME TO [_combd_alarms]",
            "ALTER TABLE x RENAME TO '_combd_outbox'",
            "/* hi */ ALTER TABLE x RENAME TO `_combd_x`",
            "ALTER TABLE x ADD COLUMN r REFERENCES _combd_outbox(id)",
            "CREATE TRIGGER t AFTER INSERT ON a BEGIN INSERT INTO _combd_outbox DEFAULT VALUES; END",
            "CREATE TEMP TRIGGER t AFTER INSERT ON a BEGIN DELETE FROM \"_combd_alarms\"; END",
            "CREATE TABLE a (r INTEGER REFERENCES _combd_alarms(id) ON DELETE CASCADE)",
        ] {
            assert!(names_a_node_table(sql), "{sql}");
        }
        for sql in [
            "ALTER TABLE x RENAME TO y",
            "ALTER TABLE x RENAME COLUMN a TO b",
            "ALTER TABLE x RENAME TO y -- _combd_inbox",
            "ALTER TABLE x RENAME TO y /* _combd_inbox */",
            "CREATE TRIGGER t AFTER INSERT ON a BEGIN INSERT INTO b VALUES (new.v); END",
            "SELECT * FROM _combd_outbox",
            "INSERT INTO t VALUES ('_combd_x')",
            "x_combd_ALTER",
            "",
        ] {
            assert!(!names_a_node_table(sql), "{sql}");
        }
    }
}
