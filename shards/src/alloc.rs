//! An allocator that counts what one call of a cell allocates, for the per-cell `memory_kb`
//! limit. The node installs it as the global allocator; counting is on only on a thread that
//! runs a call of an app with a memory limit, between [`begin`] and [`end`], and costs one
//! thread-local check per allocation otherwise.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static NET_BYTES: Cell<i64> = const { Cell::new(0) };
}

/// The system allocator, counting the bytes a call holds.
pub struct CountingAlloc;

fn add(delta: i64) {
    // try_with: the thread-locals may be gone while a thread exits.
    let _ = COUNTING.try_with(|c| {
        if c.get() {
            let _ = NET_BYTES.try_with(|n| n.set(n.get() + delta));
        }
    });
}

// SAFETY: every method forwards to the system allocator unchanged; counting touches only
// const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as i64);
        // SAFETY: the caller's guarantees for this method are `System`'s, passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        add(-(layout.size() as i64));
        // SAFETY: the caller's guarantees for this method are `System`'s, passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        add(layout.size() as i64);
        // SAFETY: the caller's guarantees for this method are `System`'s, passed on unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        add(new_size as i64 - layout.size() as i64);
        // SAFETY: the caller's guarantees for this method are `System`'s, passed on unchanged.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Starts counting this thread's allocations from zero.
pub fn begin() {
    NET_BYTES.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
}

/// Bytes allocated and not freed since [`begin`] on this thread (0 if the node does not
/// install the counting allocator).
pub fn held() -> u64 {
    NET_BYTES.with(|n| n.get()).max(0) as u64
}

/// Stops counting.
pub fn end() {
    COUNTING.with(|c| c.set(false));
}
