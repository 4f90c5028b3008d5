//! A first-in-first-out slot counter: at most `cap` holders; the rest wait in a line, asleep,
//! and are let in strictly in order. The awake cap (the wake queue) and the restore cap are
//! both this. A released slot is handed straight to the first in line, so a newcomer can never
//! overtake the line.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

#[derive(Default)]
struct Waiter {
    granted: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

/// The slots and their line.
pub(crate) struct Fifo {
    cap: usize,
    /// The longest the line may get: the caller's bound on how many tasks can wait at once.
    line_max: usize,
    used: Cell<usize>,
    line: RefCell<VecDeque<Rc<Waiter>>>,
    /// The most slots ever held at once.
    pub used_max: Cell<usize>,
    /// How many had to wait in line, in all.
    pub waited: Cell<u64>,
}

impl Fifo {
    /// `cap` slots; at most `line_max` waiters (asserted: the caller's bound on its tasks).
    pub fn new(cap: usize, line_max: usize) -> Fifo {
        Fifo {
            cap,
            line_max,
            used: Cell::new(0),
            line: RefCell::new(VecDeque::new()),
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

    /// The line's length now.
    pub fn waiting(&self) -> usize {
        self.line.borrow().len()
    }

    fn take(&self) -> bool {
        if self.used.get() < self.cap && self.line.borrow().is_empty() {
            self.used.set(self.used.get() + 1);
            self.used_max.set(self.used_max.get().max(self.used.get()));
            true
        } else {
            false
        }
    }

    /// Gives a slot back: to the first in line if anyone waits.
    pub fn release(&self) {
        let next = self.line.borrow_mut().pop_front();
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

    /// Waits for a slot. The caller must [`Fifo::release`] it exactly once.
    pub fn acquire(self: &Rc<Self>) -> Acquire {
        Acquire {
            fifo: self.clone(),
            waiter: None,
            done: false,
        }
    }

    /// [`Fifo::acquire`], calling `observe` after every poll (joining the line, leaving it),
    /// so the caller can publish the line's figures as they change.
    pub async fn acquire_observed(self: &Rc<Self>, mut observe: impl FnMut()) {
        let mut acquire = self.acquire();
        futures_lite::future::poll_fn(|cx| {
            let r = Pin::new(&mut acquire).poll(cx);
            observe();
            r
        })
        .await
    }
}

/// The future of [`Fifo::acquire`]. Dropped while waiting, it leaves the line (and passes on
/// a slot it was granted meanwhile), so a cancelled waiter cannot leak a slot.
pub(crate) struct Acquire {
    fifo: Rc<Fifo>,
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
                if self.fifo.take() {
                    self.done = true;
                    return Poll::Ready(());
                }
                let w = Rc::new(Waiter::default());
                *w.waker.borrow_mut() = Some(cx.waker().clone());
                self.fifo.waited.set(self.fifo.waited.get() + 1);
                {
                    let mut line = self.fifo.line.borrow_mut();
                    debug_assert!(
                        line.len() < self.fifo.line_max,
                        "a ready line past its bound of {}",
                        self.fifo.line_max
                    );
                    line.push_back(w.clone());
                }
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
                self.fifo.release();
            } else {
                self.fifo.line.borrow_mut().retain(|x| !Rc::ptr_eq(x, &w));
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

    fn poll(f: &mut Acquire) -> bool {
        let waker = Waker::from(std::sync::Arc::new(Noop));
        Pin::new(f)
            .poll(&mut Context::from_waker(&waker))
            .is_ready()
    }

    #[test]
    fn at_most_cap_and_strict_order() {
        let fifo = Rc::new(Fifo::new(2, 8));
        let mut a = fifo.acquire();
        let mut b = fifo.acquire();
        let mut c = fifo.acquire();
        let mut d = fifo.acquire();
        assert!(poll(&mut a) && poll(&mut b));
        assert!(!poll(&mut c) && !poll(&mut d));
        assert_eq!((fifo.used(), fifo.waiting(), fifo.waited.get()), (2, 2, 2));
        fifo.release();
        assert!(poll(&mut c), "the first in line gets the slot");
        assert!(!poll(&mut d));
        // A newcomer cannot overtake the line.
        let mut e = fifo.acquire();
        assert!(!poll(&mut e));
        fifo.release();
        assert!(poll(&mut d) && !poll(&mut e));
        assert_eq!(fifo.used_max.get(), 2);
    }

    #[test]
    fn a_cancelled_waiter_passes_its_slot_on() {
        let fifo = Rc::new(Fifo::new(1, 8));
        let mut a = fifo.acquire();
        assert!(poll(&mut a));
        let mut b = fifo.acquire();
        let mut c = fifo.acquire();
        assert!(!poll(&mut b) && !poll(&mut c));
        fifo.release(); // granted to b...
        drop(b); // ...which is cancelled before it saw it: c gets it.
        assert!(poll(&mut c));
        assert_eq!(fifo.used(), 1);
        drop(c);
        fifo.release();
        assert_eq!(fifo.used(), 0);
    }
}
