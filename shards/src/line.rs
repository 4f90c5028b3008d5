//! A line for slots: at most `cap` holders; the rest wait, asleep, in a line of their own per
//! client ([`ClientKey`]), and the clients take turns. A released slot goes to the first waiter
//! of the next client in turn, who then goes to the back of the turns if it has more waiting. So
//! a client with a hundred waiters and one with one are let in one each, in turn, and within a
//! client in order; a newcomer never overtakes its own client's line, and a client that had no
//! one waiting joins the turns at the back. With a single client it is first in, first out. The
//! awake cap (the wake queue, one client: the shard) and the restore cap (per client: the
//! restores of one client's name spray do not hold up another's) are both this.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use combd_kernel::fair::ClientKey;

#[derive(Default)]
struct Waiter {
    granted: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

/// The waiters: a line per client, and the clients' turns.
#[derive(Default)]
struct Waiting {
    /// Clients with someone waiting, the next to be let in first; each once.
    turns: VecDeque<ClientKey>,
    lines: HashMap<ClientKey, VecDeque<Rc<Waiter>>>,
    len: usize,
}

impl Waiting {
    fn push(&mut self, client: ClientKey, w: Rc<Waiter>) {
        let line = self.lines.entry(client).or_default();
        if line.is_empty() {
            self.turns.push_back(client);
        }
        line.push_back(w);
        self.len += 1;
    }

    /// The first waiter of the client whose turn it is; the client goes to the back of the
    /// turns if more of its own wait.
    fn pop(&mut self) -> Option<Rc<Waiter>> {
        let client = self.turns.pop_front()?;
        let line = self.lines.get_mut(&client)?;
        let w = line.pop_front()?;
        if line.is_empty() {
            self.lines.remove(&client);
        } else {
            self.turns.push_back(client);
        }
        self.len -= 1;
        Some(w)
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
    /// The most that may wait at once: the caller's bound on how many tasks can wait.
    line_max: usize,
    used: Cell<usize>,
    waiting: RefCell<Waiting>,
    /// The most slots ever held at once.
    pub used_max: Cell<usize>,
    /// How many had to wait, in all.
    pub waited: Cell<u64>,
}

impl Line {
    /// `cap` slots; at most `line_max` waiters (asserted: the caller's bound on its tasks).
    pub fn new(cap: usize, line_max: usize) -> Line {
        Line {
            cap,
            line_max,
            used: Cell::new(0),
            waiting: RefCell::new(Waiting::default()),
            used_max: Cell::new(0),
            waited: Cell::new(0),
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

    fn take(&self) -> bool {
        if self.used.get() < self.cap && self.waiting() == 0 {
            self.used.set(self.used.get() + 1);
            self.used_max.set(self.used_max.get().max(self.used.get()));
            true
        } else {
            false
        }
    }

    /// Gives a slot back: to the next client's first waiter if anyone waits.
    pub fn release(&self) {
        let next = self.waiting.borrow_mut().pop();
        match next {
            Some(w) => {
                w.granted.set(true);
                if let Some(waker) = w.waker.borrow_mut().take() {
                    waker.wake();
                }
            }
            None => self.used.set(self.used.get().saturating_sub(1)),
        }
    }

    /// Waits for a slot for `client`. The caller must [`Line::release`] it exactly once.
    pub fn acquire(self: &Rc<Self>, client: ClientKey) -> Acquire {
        Acquire {
            line: self.clone(),
            client,
            waiter: None,
            done: false,
        }
    }

    /// [`Line::acquire`], calling `observe` after every poll (joining the line, leaving it),
    /// so the caller can publish the line's figures as they change.
    pub async fn acquire_observed(self: &Rc<Self>, client: ClientKey, mut observe: impl FnMut()) {
        let mut acquire = self.acquire(client);
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
                if self.line.take() {
                    self.done = true;
                    return Poll::Ready(());
                }
                let w = Rc::new(Waiter::default());
                *w.waker.borrow_mut() = Some(cx.waker().clone());
                self.line.waited.set(self.line.waited.get() + 1);
                debug_assert!(
                    self.line.waiting() < self.line.line_max,
                    "a line past its bound of {}",
                    self.line.line_max
                );
                self.line.waiting.borrow_mut().push(self.client, w.clone());
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
                self.line.release();
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
        line.release();
        assert!(poll(&mut c), "the first in line gets the slot");
        assert!(!poll(&mut d));
        // A newcomer cannot overtake the line.
        let mut e = line.acquire(ONE);
        assert!(!poll(&mut e));
        line.release();
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
        line.release(); // granted to b...
        drop(b); // ...which is cancelled before it saw it: c gets it.
        assert!(poll(&mut c));
        assert_eq!(line.used(), 1);
        drop(c);
        line.release();
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
        line.release();
        assert!(poll(&mut one[0]) && !poll(&mut one[1]) && !poll(&mut two));
        line.release();
        assert!(poll(&mut two), "the other client's turn comes next");
        assert!(!poll(&mut one[1]));
        line.release();
        assert!(poll(&mut one[1]) && !poll(&mut one[2]));
        // A client cancelled while waiting leaves the turns with its line.
        let mut three = line.acquire(ClientKey::V4(3));
        assert!(!poll(&mut three));
        drop(three);
        line.release();
        assert!(poll(&mut one[2]));
        assert_eq!((line.used(), line.waiting()), (1, 0));
    }
}
