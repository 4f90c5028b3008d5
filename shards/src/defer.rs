//! Work done when a scope ends, however it ends (a leaf: the state, the cells, the connections
//! and the fleet's side use it).

/// Runs a closure when dropped: a gauge counted down however its future ends.
pub(crate) struct Defer<F: FnMut()>(pub F);

impl<F: FnMut()> Drop for Defer<F> {
    fn drop(&mut self) {
        (self.0)()
    }
}
