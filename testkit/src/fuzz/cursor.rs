//! Reading a fuzz input front to back, a byte at a time: what the imports' script decoder
//! (`imports`) and its steps (`steps`) both read with.

/// Reads the input front to back.
pub(super) struct Cursor<'a> {
    data: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(super) fn new(data: &'a [u8]) -> Cursor<'a> {
        Cursor { data }
    }

    pub(super) fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.data.split_first()?;
        self.data = rest;
        Some(b)
    }

    pub(super) fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut a = [0u8; N];
        for b in &mut a {
            *b = self.byte()?;
        }
        Some(a)
    }
}
