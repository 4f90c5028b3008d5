//! Where each verified user is, across the node's objects: the topics it is a member of (by the
//! presence of apps that keep it, `cells::presence`), on how many devices, since when, and once
//! it is in none, when it was last seen. Kept by every shard's presence as its members join and
//! leave, read by an app's call ([`crate::app::Cx::user`]), which sees only its own objects.
//!
//! Bounded: a user who is somewhere holds a place in the node's pool of members
//! (`COMBD_PRESENCE_MAX`) for each of its places, and the users last seen and in none are kept
//! up to `COMBD_PRESENCE_MAX` entries in all, the one seen longest ago forgotten first.

use std::collections::HashMap;
use std::sync::Mutex;

/// One topic a user is in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserPlace {
    /// The object's name (within its app).
    pub object: String,
    /// The topic.
    pub topic: String,
    /// Its sessions attached there.
    pub devices: u32,
    /// When it joined there, in milliseconds since the Unix epoch.
    pub since_ms: u64,
}

/// Where a user is, as an app reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserSeen {
    /// The topics of the app's objects it is in now.
    pub places: Vec<UserPlace>,
    /// When it was last in any topic of the node (any app), in milliseconds since the Unix
    /// epoch; `None` while it is in one.
    pub last_seen_ms: Option<u64>,
}

/// A place as kept: the object's key (`app/name`).
struct Place {
    key: String,
    topic: String,
    devices: u32,
    since_ms: u64,
}

#[derive(Default)]
struct Seen {
    places: Vec<Place>,
    last_seen_ms: u64,
}

/// The node's users (see the module's notes).
pub struct Users {
    capacity: usize,
    map: Mutex<HashMap<String, Seen>>,
}

impl Users {
    /// Empty, keeping at most `capacity` users in all.
    pub fn new(capacity: u64) -> Users {
        Users {
            capacity: usize::try_from(capacity).unwrap_or(usize::MAX),
            map: Mutex::new(HashMap::new()),
        }
    }

    /// `sub` is in topic `topic` of object `key` on `devices` devices now (0: it left there),
    /// since `since_ms`; `now_ms` is its last seen once it is nowhere.
    pub fn set(
        &self,
        sub: &str,
        (key, topic): (&str, &str),
        (devices, since_ms): (u32, u64),
        now_ms: u64,
    ) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(sub) {
            if devices == 0 {
                return;
            }
            forget_oldest(&mut map, self.capacity);
        }
        let seen = map.entry(sub.to_string()).or_default();
        let at = seen
            .places
            .iter()
            .position(|p| p.key == key && p.topic == topic);
        match (at, devices) {
            (Some(i), 0) => {
                seen.places.swap_remove(i);
            }
            (Some(i), n) => seen.places[i].devices = n,
            (None, 0) => {}
            (None, n) => seen.places.push(Place {
                key: key.to_string(),
                topic: topic.to_string(),
                devices: n,
                since_ms,
            }),
        }
        seen.last_seen_ms = now_ms;
    }

    /// Where `sub` is among `app`'s objects, and when it was last seen; `None` for a user the
    /// node does not know (never seen, or forgotten).
    pub fn of(&self, sub: &str, app: &str) -> Option<UserSeen> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let seen = map.get(sub)?;
        let mut places: Vec<UserPlace> = seen
            .places
            .iter()
            .filter_map(|p| {
                let name = p.key.strip_prefix(app)?.strip_prefix('/')?;
                Some(UserPlace {
                    object: name.to_string(),
                    topic: p.topic.clone(),
                    devices: p.devices,
                    since_ms: p.since_ms,
                })
            })
            .collect();
        places.sort_by(|a, b| (&a.object, &a.topic).cmp(&(&b.object, &b.topic)));
        let last_seen_ms = seen.places.is_empty().then_some(seen.last_seen_ms);
        Some(UserSeen {
            places,
            last_seen_ms,
        })
    }
}

/// Makes room for one more user: at `capacity`, the user in no topic seen longest ago goes.
fn forget_oldest(map: &mut HashMap<String, Seen>, capacity: usize) {
    if map.len() < capacity {
        return;
    }
    let oldest = map
        .iter()
        .filter(|(_, s)| s.places.is_empty())
        .min_by_key(|(_, s)| s.last_seen_ms)
        .map(|(k, _)| k.clone());
    if let Some(k) = oldest {
        map.remove(&k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_user_is_where_its_devices_are_and_last_seen_once_nowhere() {
        let users = Users::new(10);
        users.set("alice", ("chat/a", "room"), (1, 100), 100);
        users.set("alice", ("chat/b", "room"), (1, 150), 150);
        users.set("alice", ("chat/a", "room"), (2, 100), 160);
        users.set("alice", ("million/x", "p0"), (1, 170), 170);
        let seen = users.of("alice", "chat").unwrap();
        let places: Vec<(&str, u32)> = seen
            .places
            .iter()
            .map(|p| (p.object.as_str(), p.devices))
            .collect();
        assert_eq!(places, [("a", 2), ("b", 1)], "only the app's own objects");
        assert_eq!(seen.last_seen_ms, None, "present");
        users.set("alice", ("chat/a", "room"), (0, 0), 200);
        users.set("alice", ("chat/b", "room"), (0, 0), 210);
        users.set("alice", ("million/x", "p0"), (0, 0), 220);
        let seen = users.of("alice", "chat").unwrap();
        assert_eq!((seen.places.len(), seen.last_seen_ms), (0, Some(220)));
        assert!(users.of("bob", "chat").is_none());
        // A leave of a user never seen keeps nothing.
        users.set("carol", ("chat/a", "room"), (0, 0), 230);
        assert!(users.of("carol", "chat").is_none());
    }

    #[test]
    fn past_its_capacity_the_user_seen_longest_ago_is_forgotten() {
        let users = Users::new(2);
        users.set("a", ("chat/r", "room"), (1, 1), 1);
        users.set("a", ("chat/r", "room"), (0, 0), 5);
        users.set("b", ("chat/r", "room"), (1, 2), 2);
        users.set("b", ("chat/r", "room"), (0, 0), 9);
        users.set("c", ("chat/r", "room"), (1, 10), 10);
        assert!(users.of("a", "chat").is_none(), "seen longest ago");
        assert!(users.of("b", "chat").is_some());
        assert!(users.of("c", "chat").is_some());
    }
}
