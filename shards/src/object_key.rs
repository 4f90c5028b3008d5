//! An object's key, `<app>/<name>`: the one name an object has in the node and the fleet (its
//! cell in the shard's table, its routes, its alarm entries, its sessions' topics, its record
//! in etcd and its place in the bucket). It is made once from its parts ([`ObjectKey::new`]) or
//! read once from text ([`ObjectKey::parse`]), and taken apart without splitting it again.
//!
//! A leaf: it knows nothing of apps. Whether the parts are a valid app and object name is
//! checked where they come in (`app::valid_object_name`).

use std::borrow::Borrow;
use std::fmt;
use std::hash::{Hash, Hasher};

/// An object's key, `<app>/<name>`. It compares, hashes and borrows as its text, so a table
/// keyed by it is looked up with a `&str`.
#[derive(Clone)]
pub struct ObjectKey {
    text: String,
    /// Where the app's name ends in `text` (the `/`).
    app_len: usize,
}

impl ObjectKey {
    /// The key of object `name` of `app`.
    pub fn new(app: &str, name: &str) -> ObjectKey {
        let mut text = String::with_capacity(app.len() + 1 + name.len());
        text.push_str(app);
        text.push('/');
        text.push_str(name);
        ObjectKey {
            text,
            app_len: app.len(),
        }
    }

    /// The key `text` is, if it is one: an app and a name, both not empty, split at the first
    /// `/`.
    pub fn parse(text: &str) -> Option<ObjectKey> {
        match text.split_once('/') {
            Some((app, name)) if !app.is_empty() && !name.is_empty() => {
                Some(ObjectKey::new(app, name))
            }
            _ => None,
        }
    }

    /// The object's app.
    pub fn app(&self) -> &str {
        &self.text[..self.app_len]
    }

    /// The object's own name within its app.
    pub fn name(&self) -> &str {
        &self.text[self.app_len + 1..]
    }

    /// The key as text, `<app>/<name>`.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl std::ops::Deref for ObjectKey {
    type Target = str;

    fn deref(&self) -> &str {
        &self.text
    }
}

impl Borrow<str> for ObjectKey {
    fn borrow(&self) -> &str {
        &self.text
    }
}

impl PartialEq for ObjectKey {
    fn eq(&self, other: &ObjectKey) -> bool {
        self.text == other.text
    }
}

impl Eq for ObjectKey {}

impl Hash for ObjectKey {
    /// As its text (`Borrow<str>` asks it).
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.text.hash(state)
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl fmt::Debug for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.text, f)
    }
}

impl From<ObjectKey> for String {
    fn from(key: ObjectKey) -> String {
        key.text
    }
}

#[cfg(test)]
mod tests {
    use super::ObjectKey;
    use std::collections::HashMap;

    #[test]
    fn a_key_is_its_parts_and_its_text() {
        let k = ObjectKey::new("board", "main.1");
        assert_eq!(
            (k.app(), k.name(), k.as_str()),
            ("board", "main.1", "board/main.1")
        );
        let p = ObjectKey::parse("board/main.1").expect("a key");
        assert_eq!(p, k);
        assert_eq!((p.app(), p.name()), ("board", "main.1"));
        // Split at the first slash: the rest is the name (checked where names come in).
        let odd = ObjectKey::parse("a/b/c").expect("a key");
        assert_eq!((odd.app(), odd.name()), ("a", "b/c"));
        for not in ["", "board", "/main", "board/", "/"] {
            assert!(ObjectKey::parse(not).is_none(), "{not:?}");
        }
        // Looked up by its text.
        let table = HashMap::from([(k.clone(), 1)]);
        assert_eq!(table.get("board/main.1"), Some(&1));
        assert_eq!(k.to_string(), "board/main.1");
    }
}
