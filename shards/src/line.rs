//! A line for slots: at most `cap` holders, and at most `client_cap` of them one client's
//! ([`ClientKey`]; the node's own, [`ClientKey::Local`], is never held to it), or fewer, its
//! `share`, for slots that are not taken to wait on a device ([`Line::acquire_io`]); the rest wait,
//! asleep, in a line of their own per client. A free slot goes to the first waiter of the
//! client that holds the fewest slots now, among those under their cap (max-min fairness), the
//! clients holding as many taking turns: a client with a hundred waiters and one with one are
//! let in one each, in turn, and within a client in order; a newcomer never overtakes its own
//! client's line, and a client that had no one waiting joins the turns at the back. With a
//! single client it is first in, first out. The awake cap (the wake queue, one client: the
//! shard), the restore cap (per client: the restores of one client's name spray do not hold up
//! another's) and the blocking threads (per client, one client at most all but one of them: an
//! honest batch never waits for an attacker's restore or sync to end) are all this.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use combd_kernel::fair::ClientKey;

#[derive(Default)]
struct Waiter {
    /// Taken to wait on a device (a sync): held to `client_cap`, not to the share.
    io: bool,
    granted: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

/// The waiters: a line per client, and the clients' turns.
#[derive(Default)]
struct Waiters {
    /// Clients with someone waiting, in turn order; each once.
    turns: VecDeque<ClientKey>,
    lines: HashMap<ClientKey, VecDeque<Rc<Waiter>>>,
    len: usize,
}

impl Waiters {
    fn push(&mut self, client: ClientKey, w: Rc<Waiter>) {
        let line = self.lines.entry(client).or_default();
        if line.is_empty() {
            self.turns.push_back(client);
        }
        line.push_back(w);
        self.len += 1;
    }

    fn has(&self, client: ClientKey) -> bool {
        self.lines.contains_key(&client)
    }

    /// The first waiter of the client `pick` chooses among those waiting (by its place in the
    /// turns, the first of the lowest), with that client; the client goes to the back of the
    /// turns if more of its own wait.
    fn pop(
        &mut self,
        pick: impl Fn(ClientKey, &Waiter) -> Option<usize>,
    ) -> Option<(ClientKey, Rc<Waiter>)> {
        let mut best: Option<(usize, usize)> = None;
        for (i, c) in self.turns.iter().enumerate() {
            let first = self.lines.get(c).and_then(|l| l.front());
            if let Some(rank) = first.and_then(|w| pick(*c, w)) {
                if best.is_none_or(|(_, r)| rank < r) {
                    best = Some((i, rank));
                }
            }
        }
        let client = self.turns.remove(best?.0)?;
        let line = self.lines.get_mut(&client)?;
        let w = line.pop_front()?;
        if line.is_empty() {
            self.lines.remove(&client);
        } else {
            self.turns.push_back(client);
        }
        self.len -= 1;
        Some((client, w))
    }

    /// Takes `w` (a cancelled waiter) out of its client's line.
    fn remove(&mut self, client: ClientKey, w: &Rc<Waiter>) {
        let Some(line) = self.lines.get_mut(&client) else {
            return;
        };
        let before = line.len();
        line.retain(|x| !Rc::ptr_eq(x, w));
        self.len -= before - line.len();
        if line.is_empty() {
            self.lines.remove(&client);
            self.turns.retain(|c| *c != client);
        }
    }
}

/// The slots and their lines.
pub(crate) struct Line {
    cap: usize,
    /// The most slots one client may hold at once (not the node's own).
    client_cap: usize,
    /// The most one client may hold at once for jobs that are not device waits: at most
    /// `client_cap`, set by the line's owner as clients come and go.
    share: Cell<usize>,
    /// The most that may wait at once: the caller's bound on how many tasks can wait.
    line_max: usize,
    used: Cell<usize>,
    /// Slots held per client, those holding any.
    held: RefCell<HashMap<ClientKey, usize>>,
    waiting: RefCell<Waiters>,
    /// The most slots ever held at once.
    pub used_max: Cell<usize>,
    /// How many had to wait, in all.
    pub waited: Cell<u64>,
    /// How many waited while a slot was free, their client holding its `client_cap`.
    pub waited_share: Cell<u64>,
}

impl Line {
    /// `cap` slots, any number of them one client's; at most `line_max` waiters (asserted: the
    /// caller's bound on its tasks).
    pub fn new(cap: usize, line_max: usize) -> Line {
        Line::with_client_cap(cap, cap, line_max)
    }

    /// `cap` slots, at most `client_cap` of them one client's (the node's own excepted).
    pub fn with_client_cap(cap: usize, client_cap: usize, line_max: usize) -> Line {
        Line {
            cap,
            client_cap: client_cap.clamp(1, cap.max(1)),
            share: Cell::new(client_cap.clamp(1, cap.max(1))),
            line_max,
            used: Cell::new(0),
            held: RefCell::new(HashMap::new()),
            waiting: RefCell::new(Waiters::default()),
            used_max: Cell::new(0),
            waited: Cell::new(0),
            waited_share: Cell::new(0),
        }
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Slots held now.
    pub fn used(&self) -> usize {
        self.used.get()
    }

    /// How many wait now, every client's.
    pub fn waiting(&self) -> usize {
        self.waiting.borrow().len
    }

    fn held_by(&self, client: ClientKey) -> usize {
        self.held.borrow().get(&client).copied().unwrap_or(0)
    }

    /// Whether `client` may take one more slot, for a device wait (`io`) or not.
    fn under_cap(&self, client: ClientKey, io: bool) -> bool {
        let cap = if io {
            self.client_cap
        } else {
            self.share.get()
        };
        client == ClientKey::Local || self.held_by(client) < cap
    }

    /// The most slots one client may hold now for jobs that are not device waits.
    pub fn share(&self) -> usize {
        self.share.get()
    }

    /// Sets that share (at least one, at most `client_cap`): a client holding more keeps them
    /// until it releases them; a higher share hands free slots to waiters.
    pub fn set_share(&self, n: usize) {
        let n = n.clamp(1, self.client_cap);
        let raised = n > self.share.replace(n);
        if raised {
            self.grant();
        }
    }

    fn hold(&self, client: ClientKey) {
        *self.held.borrow_mut().entry(client).or_insert(0) += 1;
        self.used.set(self.used.get() + 1);
        self.used_max.set(self.used_max.get().max(self.used.get()));
    }

    /// A slot for `client` at once: one is free, the client is under its cap and none of its
    /// own waits. (No one else under their cap waits while a slot is free: [`Line::grant`]
    /// hands each free slot on as it frees.)
    fn take(&self, client: ClientKey, io: bool) -> bool {
        let free = self.used.get() < self.cap;
        if free && self.under_cap(client, io) && !self.waiting.borrow().has(client) {
            self.hold(client);
            true
        } else {
            false
        }
    }

    /// Hands free slots to waiters: each to the first waiter of the client holding the fewest.
    fn grant(&self) {
        while self.used.get() < self.cap {
            let next = self
                .waiting
                .borrow_mut()
                .pop(|c, w| self.under_cap(c, w.io).then(|| self.held_by(c)));
            let Some((client, w)) = next else {
                return;
            };
            self.hold(client);
            w.granted.set(true);
            let waker = w.waker.borrow_mut().take();
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }

    /// Gives back a slot `client` held: to the next waiter if anyone waits.
    pub fn release(&self, client: ClientKey) {
        {
            let mut held = self.held.borrow_mut();
            match held.get_mut(&client) {
                Some(n) if *n > 1 => *n -= 1,
                Some(_) => {
                    held.remove(&client);
                }
                None => debug_assert!(false, "a slot released that {client:?} did not hold"),
            }
        }
        self.used.set(self.used.get().saturating_sub(1));
        self.grant();
    }

    /// Waits for a slot for `client`. The caller must [`Line::release`] it exactly once.
    #[cfg(test)]
    pub fn acquire(self: &Rc<Self>, client: ClientKey) -> Acquire {
        self.acquire_as(client, false)
    }

    /// [`Line::acquire`] for a job that waits on a device (a sync): held to `client_cap`, not
    /// to the share.
    #[cfg(test)]
    pub fn acquire_io(self: &Rc<Self>, client: ClientKey) -> Acquire {
        self.acquire_as(client, true)
    }

    fn acquire_as(self: &Rc<Self>, client: ClientKey, io: bool) -> Acquire {
        Acquire {
            line: self.clone(),
            client,
            io,
            waiter: None,
            done: false,
        }
    }

    /// [`Line::acquire`] (or [`Line::acquire_io`] if `io`), calling `observe` after every poll
    /// (joining the line, leaving it), so the caller can publish the line's figures as they
    /// change.
    pub async fn acquire_observed(
        self: &Rc<Self>,
        client: ClientKey,
        io: bool,
        mut observe: impl FnMut(),
    ) {
        let mut acquire = self.acquire_as(client, io);
        futures_lite::future::poll_fn(|cx| {
            let r = Pin::new(&mut acquire).poll(cx);
            observe();
            r
        })
        .await
    }
}

/// The future of [`Line::acquire`]. Dropped while waiting, it leaves its line (and passes on a
/// slot it was granted meanwhile), so a cancelled waiter cannot leak a slot.
pub(crate) struct Acquire {
    line: Rc<Line>,
    client: ClientKey,
    io: bool,
    waiter: Option<Rc<Waiter>>,
    done: bool,
}

impl Future for Acquire {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.done {
            return Poll::Ready(());
        }
        match &self.waiter {
            None => {
                let line = &self.line;
                if line.take(self.client, self.io) {
                    self.done = true;
                    return Poll::Ready(());
                }
                let w = Rc::new(Waiter {
                    io: self.io,
                    ..Waiter::default()
                });
                *w.waker.borrow_mut() = Some(cx.waker().clone());
                line.waited.set(line.waited.get() + 1);
                if line.used() < line.cap() && !line.under_cap(self.client, self.io) {
                    line.waited_share.set(line.waited_share.get() + 1);
                }
                debug_assert!(
                    line.waiting() < line.line_max,
                    "a line past its bound of {}",
                    line.line_max
                );
                line.waiting.borrow_mut().push(self.client, w.clone());
                self.waiter = Some(w);
                Poll::Pending
            }
            Some(w) if w.granted.get() => {
                self.done = true;
                Poll::Ready(())
            }
            Some(w) => {
                *w.waker.borrow_mut() = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if let Some(w) = self.waiter.take() {
            if w.granted.get() {
                self.line.release(self.client);
            } else {
                self.line.waiting.borrow_mut().remove(self.client, &w);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::task::Wake;

    struct Noop;
    impl Wake for Noop {
        fn wake(self: std::sync::Arc<Self>) {}
    }

    const ONE: ClientKey = ClientKey::V4(1);
    const TWO: ClientKey = ClientKey::V4(2);

    fn poll(f: &mut Acquire) -> bool {
        let waker = Waker::from(std::sync::Arc::new(Noop));
        Pin::new(f)
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
    }

    #[test]
    fn at_most_cap_and_strict_order() {
        let line = Rc::new(Line::new(2, 8));
        let mut a = line.acquire(ONE);
        let mut b = line.acquire(ONE);
        let mut c = line.acquire(ONE);
        let mut d = line.acquire(ONE);
        assert!(poll(&mut a) && poll(&mut b));
        assert!(!poll(&mut c) && !poll(&mut d));
        assert_eq!((line.used(), line.waiting(), line.waited.get()), (2, 2, 2));
        line.release(ONE);
        assert!(poll(&mut c), "the first in line gets the slot");
        assert!(!poll(&mut d));
        // A newcomer cannot overtake the line.
        let mut e = line.acquire(ONE);
        assert!(!poll(&mut e));
        line.release(ONE);
        assert!(poll(&mut d) && !poll(&mut e));
        assert_eq!(line.used_max.get(), 2);
    }

    #[test]
    fn a_cancelled_waiter_passes_its_slot_on() {
        let line = Rc::new(Line::new(1, 8));
        let mut a = line.acquire(ONE);
        assert!(poll(&mut a));
        let mut b = line.acquire(ONE);
        let mut c = line.acquire(ONE);
        assert!(!poll(&mut b) && !poll(&mut c));
        line.release(ONE); // granted to b...
        drop(b); // ...which is cancelled before it saw it: c gets it.
        assert!(poll(&mut c));
        assert_eq!(line.used(), 1);
        drop(c);
        line.release(ONE);
        assert_eq!(line.used(), 0);
    }

    #[test]
    fn clients_take_turns_and_each_keeps_its_order() {
        let line = Rc::new(Line::new(1, 16));
        let mut held = line.acquire(ONE);
        assert!(poll(&mut held));
        // ONE queues three, then TWO one: TWO's is let in second, not fourth.
        let mut one: Vec<Acquire> = (0..3).map(|_| line.acquire(ONE)).collect();
        let mut two = line.acquire(TWO);
        for a in one.iter_mut() {
            assert!(!poll(a));
        }
        assert!(!poll(&mut two));
        assert_eq!(line.waiting(), 4);
        line.release(ONE);
        assert!(poll(&mut one[0]) && !poll(&mut one[1]) && !poll(&mut two));
        line.release(ONE);
        assert!(poll(&mut two), "the other client's turn comes next");
        assert!(!poll(&mut one[1]));
        line.release(TWO);
        assert!(poll(&mut one[1]) && !poll(&mut one[2]));
        // A client cancelled while waiting leaves the turns with its line.
        let mut three = line.acquire(ClientKey::V4(3));
        assert!(!poll(&mut three));
        drop(three);
        line.release(ONE);
        assert!(poll(&mut one[2]));
        assert_eq!((line.used(), line.waiting()), (1, 0));
    }

    #[test]
    fn a_free_slot_goes_to_the_client_holding_fewest() {
        let line = Rc::new(Line::new(3, 16));
        let mut one: Vec<Acquire> = (0..5).map(|_| line.acquire(ONE)).collect();
        for a in one.iter_mut().take(3) {
            assert!(poll(a));
        }
        assert!(!poll(&mut one[3]) && !poll(&mut one[4]));
        let mut two = line.acquire(TWO);
        assert!(!poll(&mut two));
        // ONE is first in the turns, but holds two slots to TWO's none.
        line.release(ONE);
        assert!(poll(&mut two), "the client holding fewer goes first");
        assert!(!poll(&mut one[3]));
        line.release(ONE);
        assert!(poll(&mut one[3]) && !poll(&mut one[4]));
        assert_eq!((line.used(), line.waiting()), (3, 1));
    }

    #[test]
    fn one_client_holds_at_most_its_cap_and_the_node_is_not_held_to_it() {
        let line = Rc::new(Line::with_client_cap(3, 2, 16));
        let mut one: Vec<Acquire> = (0..3).map(|_| line.acquire(ONE)).collect();
        assert!(poll(&mut one[0]) && poll(&mut one[1]));
        assert!(!poll(&mut one[2]), "past its cap while a slot is free");
        assert_eq!((line.used(), line.waited_share.get()), (2, 1));
        let mut two = line.acquire(TWO);
        assert!(poll(&mut two), "the free slot is another client's at once");
        line.release(TWO);
        assert!(!poll(&mut one[2]), "still at its cap");
        line.release(ONE);
        assert!(poll(&mut one[2]));
        let mut local: Vec<Acquire> = (0..3).map(|_| line.acquire(ClientKey::Local)).collect();
        assert!(poll(&mut local[0]));
        assert!(!poll(&mut local[1]), "no slot free");
        line.release(ONE);
        line.release(ONE);
        assert!(
            poll(&mut local[1]) && poll(&mut local[2]),
            "the node's own: no cap"
        );
        assert_eq!(line.used(), 3);
    }

    #[test]
    fn a_lowered_share_holds_back_new_slots_and_a_raised_one_hands_them_out() {
        let line = Rc::new(Line::with_client_cap(4, 3, 16));
        let mut one: Vec<Acquire> = (0..4).map(|_| line.acquire(ONE)).collect();
        assert!(poll(&mut one[0]) && poll(&mut one[1]) && poll(&mut one[2]));
        assert!(!poll(&mut one[3]));
        line.set_share(1);
        line.release(ONE);
        assert!(!poll(&mut one[3]), "holding two, past a share of one");
        let mut io = line.acquire_io(TWO);
        assert!(poll(&mut io), "another client's slot at once");
        line.release(TWO);
        // A device wait of ONE's is held to the cap (three), not the share.
        let mut sync = line.acquire_io(ONE);
        assert!(!poll(&mut sync), "behind its own waiter, in order");
        line.set_share(3);
        assert!(poll(&mut one[3]), "the raised share lets the waiter in");
        assert!(!poll(&mut sync), "three held: the cap");
        line.set_share(0);
        assert_eq!(line.share(), 1, "never below one");
        line.set_share(9);
        assert_eq!(line.share(), 3, "never above the cap");
    }
}
