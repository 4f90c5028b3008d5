//! Presence: who is attached to each topic of an object, kept by the node for an app that asks
//! for it ([`App::presence`](crate::app::App::presence)), and told to the topic's numbered
//! sessions as it changes (`crate::ws::numbered`).
//!
//! A **member** of a topic is a verified identity (a token's `sub`: two tabs of one user are one
//! member, with two devices) or, for a session without one, the session itself. The object's
//! home shard keeps its topics' members here, beside its cell and not in it: an object let go
//! while its sessions stay attached (idle, or under pressure) keeps them, and their detaches
//! find them when it comes back. A node's restart forgets them with its sessions; in a fleet the
//! sessions of an object are all on its owner (their WebSockets pass through to it), so a new
//! owner starts with none, as its sessions reconnect to it.
//!
//! Each batch of an object applies its attaches and detaches here once it ran, in its order,
//! and makes one change a topic: `!presence|{"join":[...],"leave":[...]}` to the topic's
//! numbered sessions, after the batch's own broadcasts, and to each session that attached a
//! snapshot, `!presence|{"members":[...],"unlisted":n}`. Listed members are bounded per topic
//! (`COMBD_PRESENCE_TOPIC_MAX`) and on the node (`COMBD_PRESENCE_MAX`, a pool each client holds
//! its share of): a session attaching past either is attached, not listed, and counted in its
//! topic's `unlisted`.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};

use combd_kernel::fair::ClientKey;

use crate::app::{AppError, Effect, Member as Listed, Output, PresenceSource, SessionId};
use crate::fair::Share;
use crate::job::Owned;
use crate::object_key::ObjectKey;
use crate::state::ShardState;
use crate::stats::ShardStats;

/// The presence of the objects living on one shard.
pub(crate) struct Presence {
    state: Rc<ShardState>,
    objects: RefCell<HashMap<ObjectKey, PresenceView>>,
}

/// One object's presence, shared with its batch's thread: an app's call reads it
/// ([`crate::app::Cx::presence`]) as it was before the batch; the batch's own attaches and
/// detaches are applied once it ran, on the shard, never while a call reads.
#[derive(Clone, Default)]
pub(crate) struct PresenceView(Arc<Mutex<ObjectPresence>>);

impl PresenceView {
    fn lock(&self) -> MutexGuard<'_, ObjectPresence> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl PresenceSource for PresenceView {
    fn members(&self, topic: &str) -> (Vec<Listed>, u64) {
        let o = self.lock();
        let Some(t) = o.topics.get(topic) else {
            return (Vec::new(), 0);
        };
        let members = t
            .members
            .iter()
            .map(|(who, m)| Listed {
                who: who.clone(),
                verified: m.verified,
                name: m.name.clone(),
                devices: m.devices,
                since_ms: m.since_ms,
            })
            .collect();
        (members, t.unlisted)
    }
}

/// One object's topics and the sessions attached to them.
#[derive(Default)]
struct ObjectPresence {
    topics: HashMap<String, TopicPresence>,
    sessions: HashMap<SessionId, Seat>,
}

/// Where an attached session counts: its topic, the member it is (or would be) one device
/// of, a verified identity or not, and while it is not listed (the topic or the node was
/// full), what listing it takes: its name claim and its client.
struct Seat {
    topic: String,
    who: String,
    verified: bool,
    waiting: Option<(Option<String>, ClientKey)>,
}

/// One topic's members, by name, and the sessions attached to it but not listed.
#[derive(Default)]
struct TopicPresence {
    members: BTreeMap<String, Member>,
    unlisted: u64,
}

/// A member of a topic.
struct Member {
    /// A verified identity (else a session).
    verified: bool,
    /// Its token's `name` claim, if it has one.
    name: Option<String>,
    /// Its sessions attached to the topic.
    devices: u32,
    /// When it joined, in milliseconds since the Unix epoch.
    since_ms: u64,
    /// Its place in the node's pool of members, given back when it leaves.
    _share: Share,
}

/// An attach or a detach of a batch, as presence sees it.
pub(crate) enum Move {
    Attach {
        /// Its input's place in the batch (its answer says whether it attached).
        index: usize,
        session: SessionId,
        topic: String,
        /// A verified identity's subject and name claim.
        identity: Option<(String, Option<String>)>,
        /// Who its pool place is counted to.
        asker: ClientKey,
        /// A numbered session, told the topic's members.
        numbered: bool,
    },
    Detach {
        session: SessionId,
    },
}

/// The attaches and detaches of a batch, in its order.
pub(crate) fn moves<'a>(
    inputs: &[Owned],
    askers: impl Iterator<Item = ClientKey> + 'a,
) -> Vec<Move> {
    inputs
        .iter()
        .zip(askers)
        .enumerate()
        .filter_map(|(index, (input, asker))| match input {
            Owned::Attach {
                session,
                subscribed: Some(s),
                client,
                ..
            } => Some(Move::Attach {
                index,
                session: *session,
                topic: s.topic.clone(),
                identity: client.as_ref().map(|c| (c.subject.clone(), c.name.clone())),
                asker,
                numbered: s.resume.is_some(),
            }),
            Owned::Detach { session } => Some(Move::Detach { session: *session }),
            _ => None,
        })
        .collect()
}

/// What a batch changed of one topic: the members whose entry changed (joined, left, or
/// another device), each a verified identity or not, and whether its unlisted count moved.
#[derive(Default)]
struct Changed {
    who: BTreeMap<String, bool>,
    unlisted: bool,
    /// A member left: room for one waiting unlisted.
    freed: bool,
}

impl Presence {
    pub fn new(state: Rc<ShardState>) -> Presence {
        Presence {
            state,
            objects: RefCell::new(HashMap::new()),
        }
    }

    /// Applies a batch's `moves` to object `key`'s presence (an attach only if its answer in
    /// `outputs` says it attached), and adds to `effects` each changed topic's change and a
    /// snapshot for each numbered session that attached.
    pub fn apply(
        &self,
        key: &ObjectKey,
        moves: Vec<Move>,
        outputs: &[Result<Output, AppError>],
        effects: &mut Vec<Effect>,
    ) {
        if moves.is_empty() {
            return;
        }
        let mut objects = self.objects.borrow_mut();
        let view = objects.entry(key.clone()).or_default().clone();
        let mut object = view.lock();
        let object = &mut *object;
        let mut changed: BTreeMap<String, Changed> = BTreeMap::new();
        let mut snapshots = Vec::new();
        for m in moves {
            match m {
                Move::Attach { index, .. } if !matches!(outputs.get(index), Some(Ok(_))) => {}
                Move::Attach {
                    session,
                    topic,
                    identity,
                    asker,
                    numbered,
                    ..
                } => {
                    if numbered {
                        snapshots.push((session, topic.clone()));
                    }
                    self.attach(object, &mut changed, session, topic, identity, asker);
                }
                Move::Detach { session } => object.detach(&mut changed, session),
            }
        }
        for (topic, c) in changed.iter_mut().filter(|(_, c)| c.freed) {
            self.promote(object, topic, c);
        }
        for (topic, c) in &changed {
            self.tell_users(key, topic, object, c);
            if let Some(payload) = object.change(topic, c) {
                ShardStats::add(&self.state.stats().presence_changes, 1);
                effects.push(Effect::Presence {
                    topic: topic.clone(),
                    to: None,
                    payload,
                });
            }
        }
        for (session, topic) in snapshots {
            let payload = object.snapshot(&topic);
            effects.push(Effect::Presence {
                topic,
                to: Some(session),
                payload,
            });
        }
        if object.sessions.is_empty() {
            objects.remove(key);
        }
    }

    /// Tells the node's users (`crate::users`) where the verified members `c` names of `key`'s
    /// `topic` are now.
    fn tell_users(&self, key: &ObjectKey, topic: &str, object: &ObjectPresence, c: &Changed) {
        let users = &self.state.node().users;
        let now = now_ms();
        let members = object.topics.get(topic).map(|t| &t.members);
        for (who, _) in c.who.iter().filter(|(_, verified)| **verified) {
            let (devices, since) = members
                .and_then(|m| m.get(who))
                .map_or((0, 0), |m| (m.devices, m.since_ms));
            users.set(who, (key.as_str(), topic), (devices, since), now);
        }
    }

    /// Object `key`'s presence, for its next batch to read.
    pub fn view(&self, key: &ObjectKey) -> Option<PresenceView> {
        self.objects.borrow().get(key).cloned()
    }

    /// A session attaches to `topic`: one more device of its member, a new member, or (the
    /// topic or the node full) unlisted. A session attached already (attaching again in place)
    /// changes nothing.
    fn attach(
        &self,
        object: &mut ObjectPresence,
        changed: &mut BTreeMap<String, Changed>,
        session: SessionId,
        topic: String,
        identity: Option<(String, Option<String>)>,
        asker: ClientKey,
    ) {
        if object.sessions.contains_key(&session) {
            return;
        }
        let t = object.topics.entry(topic.clone()).or_default();
        let (who, verified, name) = match identity {
            Some((sub, name)) => (sub, true, name),
            None => (session.to_string(), false, None),
        };
        let listed = match t.members.get_mut(&who) {
            Some(m) => {
                m.devices += 1;
                true
            }
            None => self.join(t, &who, verified, name.clone(), asker),
        };
        let c = changed.entry(topic.clone()).or_default();
        if listed {
            c.who.insert(who.clone(), verified);
        } else {
            t.unlisted += 1;
            c.unlisted = true;
            ShardStats::add(&self.state.stats().presence_unlisted, 1);
        }
        let waiting = (!listed).then_some((name, asker));
        let seat = Seat {
            topic,
            who,
            verified,
            waiting,
        };
        object.sessions.insert(session, seat);
    }

    /// Lists sessions of `topic` that were attached unlisted, while it and the node have room
    /// (a member left): each joins as it would have as it attached.
    fn promote(&self, object: &mut ObjectPresence, topic: &str, c: &mut Changed) {
        let ObjectPresence { topics, sessions } = object;
        let Some(t) = topics.get_mut(topic) else {
            return;
        };
        let waiting = sessions
            .values_mut()
            .filter(|s| s.topic == topic && s.waiting.is_some());
        for seat in waiting {
            if t.unlisted == 0 {
                return;
            }
            let Some((name, asker)) = seat.waiting.clone() else {
                continue;
            };
            if let Some(m) = t.members.get_mut(&seat.who) {
                m.devices += 1;
            } else if !self.join(t, &seat.who, seat.verified, name, asker) {
                return;
            }
            seat.waiting = None;
            t.unlisted -= 1;
            c.unlisted = true;
            c.who.insert(seat.who.clone(), seat.verified);
        }
    }

    /// Lists a new member in `t`, if the topic and the node's pool (within its client's share)
    /// have room for it.
    fn join(
        &self,
        t: &mut TopicPresence,
        who: &str,
        verified: bool,
        name: Option<String>,
        asker: ClientKey,
    ) -> bool {
        if t.members.len() as u64 >= self.state.settings().presence_topic_max {
            return false;
        }
        let Ok(share) = self.state.node().pools.presence.take(asker, 1) else {
            return false;
        };
        let member = Member {
            verified,
            name,
            devices: 1,
            since_ms: now_ms(),
            _share: share,
        };
        t.members.insert(who.to_string(), member);
        true
    }
}

impl ObjectPresence {
    /// A session detaches: one device fewer of its member, which leaves with its last.
    fn detach(&mut self, changed: &mut BTreeMap<String, Changed>, session: SessionId) {
        let Some(seat) = self.sessions.remove(&session) else {
            return;
        };
        let Some(t) = self.topics.get_mut(&seat.topic) else {
            return;
        };
        let c = changed.entry(seat.topic.clone()).or_default();
        match seat.waiting {
            None => {
                if let Some(m) = t.members.get_mut(&seat.who) {
                    m.devices = m.devices.saturating_sub(1);
                    if m.devices == 0 {
                        t.members.remove(&seat.who);
                        c.freed = true;
                    }
                }
                c.who.insert(seat.who, seat.verified);
            }
            Some(_) => {
                t.unlisted = t.unlisted.saturating_sub(1);
                c.unlisted = true;
            }
        }
        if t.members.is_empty() && t.unlisted == 0 {
            self.topics.remove(&seat.topic);
        }
    }

    /// A topic's change, as its numbered sessions are told it: the members that joined or
    /// changed (with their entry now) and those that left; `None` if nothing did.
    fn change(&self, topic: &str, c: &Changed) -> Option<Vec<u8>> {
        let t = self.topics.get(topic);
        let (mut join, mut leave) = (Vec::new(), Vec::new());
        for who in c.who.keys() {
            match t.and_then(|t| t.members.get(who)) {
                Some(m) => join.push(m.json(who)),
                None => leave.push(serde_json::Value::from(who.as_str())),
            }
        }
        if join.is_empty() && leave.is_empty() && !c.unlisted {
            return None;
        }
        let unlisted = t.map_or(0, |t| t.unlisted);
        let v = serde_json::json!({ "join": join, "leave": leave, "unlisted": unlisted });
        Some(v.to_string().into_bytes())
    }

    /// A topic's members, as a session attaching is told them.
    fn snapshot(&self, topic: &str) -> Vec<u8> {
        self.members(topic).to_string().into_bytes()
    }

    fn members(&self, topic: &str) -> serde_json::Value {
        let t = self.topics.get(topic);
        let members: Vec<_> = t
            .map(|t| t.members.iter().map(|(who, m)| m.json(who)).collect())
            .unwrap_or_default();
        let unlisted = t.map_or(0, |t| t.unlisted);
        serde_json::json!({ "members": members, "unlisted": unlisted })
    }
}

impl Member {
    fn json(&self, who: &str) -> serde_json::Value {
        let mut v = serde_json::json!({
            "who": who,
            "verified": self.verified,
            "devices": self.devices,
            "since": self.since_ms,
        });
        if let Some(name) = &self.name {
            v["name"] = name.as_str().into();
        }
        v
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
