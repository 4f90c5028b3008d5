//! The interface between the node and its built-in apps.
//!
//! An app is Rust code compiled into the node and registered by name at start-up. Requests to
//! `/o/<app>/<name>` reach the app with the object's `name`: an HTTP request through
//! [`App::http`], each WebSocket message of a session attached to the object through
//! [`App::ws_message`]. (Durable objects with their own SQLite database build on this in the
//! cells layer.)

use std::sync::Arc;

use crate::http::{Request, Response};

/// A message a session sent or is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    /// A text message.
    Text(&'a str),
    /// A binary message.
    Binary(&'a [u8]),
}

/// What an app's handler may send back to the session it is serving.
pub trait Reply {
    /// Queues a message to the session.
    fn send(&mut self, msg: Message<'_>);
}

/// A built-in app.
pub trait App: Send + Sync + 'static {
    /// The app's name, the `<app>` of `/o/<app>/<name>`.
    fn name(&self) -> &'static str;

    /// Answers an HTTP request to object `object` (a WebSocket upgrade never reaches here).
    fn http(&self, object: &str, req: &Request<'_>) -> Response;

    /// Handles one message from a session attached to `object`.
    fn ws_message(&self, object: &str, msg: Message<'_>, reply: &mut dyn Reply);
}

/// The apps of a node, by name.
#[derive(Clone, Default)]
pub struct Apps {
    apps: Vec<Arc<dyn App>>,
}

impl Apps {
    /// No apps.
    pub fn new() -> Apps {
        Apps::default()
    }

    /// Adds an app; a second app of the same name is refused.
    pub fn register(&mut self, app: Arc<dyn App>) -> Result<(), String> {
        if self.get(app.name()).is_some() {
            return Err(format!("app {:?} registered twice", app.name()));
        }
        self.apps.push(app);
        Ok(())
    }

    /// The app of this name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn App>> {
        self.apps.iter().find(|a| a.name() == name)
    }

    /// The names of every app.
    pub fn names(&self) -> Vec<&'static str> {
        self.apps.iter().map(|a| a.name()).collect()
    }
}

/// Whether `name` is a valid object name: 1 to
/// [`OBJECT_NAME_MAX_BYTES`](combd_kernel::limits::OBJECT_NAME_MAX_BYTES) bytes of
/// `[A-Za-z0-9_.-]`, not starting with a dot. Such a name is always one safe path component.
pub fn valid_object_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= combd_kernel::limits::OBJECT_NAME_MAX_BYTES
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn object_names() {
        assert!(valid_object_name("board-1"));
        assert!(valid_object_name("a.b_c"));
        assert!(valid_object_name(&"a".repeat(64)));
        assert!(!valid_object_name(&"a".repeat(65)));
        assert!(!valid_object_name(""));
        assert!(!valid_object_name(".."));
        assert!(!valid_object_name(".hidden"));
        assert!(!valid_object_name("a/b"));
        assert!(!valid_object_name("a%2fb"));
        assert!(!valid_object_name("é"));
    }
}
